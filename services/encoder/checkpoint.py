"""The speech tokenizer's weights from the official directory (THUDM's glm-4-voice-tokenizer layout): `config.json`
and `model*.safetensors` holding the whole Whisper-VQ model under `model.encoder.` and `model.decoder.`.

Only the encoder up to its quantizer makes codes, so the loader takes the `model.encoder.` tensors and leaves out,
by name, what it never runs: the layers from `quantize_position` on, the final `layer_norm` (after them), and the
quantizer's training state (`ema_count`, `ema_weight`). Every other tensor must match the model built from
config.json: a missing, extra or misshapen one is refused with its name (services/common/checkpoint.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import torch

from services.common.checkpoint import CheckpointMismatch, load_strict
from services.encoder.config import REQUIRED, WhisperVQConfig, read_config
from services.encoder.whisper_vq import WhisperVQEncoder

PREFIX = "model.encoder."
TRAINING_STATE = ("ema_count", "ema_weight")


def encoder_state(tensors: dict[str, torch.Tensor], cfg: WhisperVQConfig) -> dict[str, torch.Tensor]:
    """The official file's tensors → those the encoder runs, under its own names (module docstring)."""
    state = {}
    for key, value in tensors.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX) :]
        layer = re.match(r"layers\.(\d+)\.", name)
        if (layer and int(layer.group(1)) >= cfg.quantize_position) or name.startswith("layer_norm.") \
                or name in TRAINING_STATE:
            continue
        state[name] = value
    return state


def load_tokenizer(directory: str | Path) -> WhisperVQEncoder:
    from safetensors import safe_open  # (imported here: only the encoder needs it)

    directory = Path(directory)
    files = sorted(directory.glob("model*.safetensors"))
    if not (directory / "config.json").exists() or not files:
        raise FileNotFoundError(f"{directory}: a speech tokenizer directory holds config.json and model*.safetensors")
    cfg = read_config(directory / "config.json")
    tensors = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                tensors |= {key: f.get_tensor(key) for key in f.keys() if key.startswith(PREFIX)}
        except Exception as exc:  # noqa: BLE001  a truncated or foreign file: say which
            raise CheckpointMismatch(f"{path}: not a safetensors file ({exc})") from None
    model = WhisperVQEncoder(cfg)
    load_strict(model, encoder_state(tensors, cfg), f"{directory} (the {PREFIX[:-1]} tensors)")
    return model.eval()


def random_tokenizer(cfg: WhisperVQConfig, seed: int = 0) -> WhisperVQEncoder:
    """The architecture with random weights (the real size's benchmarks, the tests)."""
    torch.manual_seed(seed)
    return WhisperVQEncoder(cfg).eval()


def save_tokenizer(model: WhisperVQEncoder, directory: str | Path, extra: dict[str, torch.Tensor] | None = None) -> None:
    """The official layout (config.json with its field names, model.safetensors under `model.encoder.`); `extra`:
    more tensors by their full names, as the official file's decoder and later layers (tests)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = asdict(model.cfg) | REQUIRED | {"architectures": ["WhisperVQEncoder"], "pooling_position": model.cfg.quantize_position,
                                             "quantize_encoder_only": True}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {PREFIX + k: v.contiguous() for k, v in model.state_dict().items()} | (extra or {})
    save_file(tensors, str(directory / "model.safetensors"))
