"""BigVGAN-v2 generators (NVIDIA's `bigvgan` package): mel [num_mels, frames] → waveform.

A checkpoint directory holds the package's own format: config.json (hyperparameters) and
bigvgan_generator.pt ({"generator": state_dict}). Loading is local only; nothing is fetched.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import warnings
from pathlib import Path

import torch

from services.vocoder import bigvgan_package
from services.vocoder.token_decoder import MelFormat

CONFIG_DIR = Path(__file__).parent / "configs"
PRESETS = {"tiny": "tiny.json", "moss-speech": "bigvgan_24khz_80band_480x.json",
           "bigvgan-v2-22khz-80band-256x": "bigvgan_v2_22khz_80band_256x.json"}  # the published v2 layout (bench)


def read_config(path: str | Path):
    bigvgan_package.model_module()  # (the package without its training utilities)
    from bigvgan.env import AttrDict

    return AttrDict(json.loads(Path(path).read_text()))


def preset_config(name: str):
    try:
        return read_config(CONFIG_DIR / PRESETS[name])
    except KeyError:
        raise ValueError(f"unknown vocoder preset {name!r}; known: {', '.join(PRESETS)}") from None


def mel_format(h) -> MelFormat:
    """The mel format a generator consumes; its hop is the product of its upsample rates."""
    hop = math.prod(h["upsample_rates"])
    if "hop_size" in h and h["hop_size"] != hop:
        raise ValueError(f"BigVGAN config: hop_size {h['hop_size']} but upsample rates multiply to {hop}")
    return MelFormat(int(h["sampling_rate"]), int(h["num_mels"]), hop)


def _weight_norm_form(state_dict: dict) -> str:
    """How a checkpoint stores its conv weights: "g_v" (the package's weight_norm: weight_g/weight_v),
    "parametrizations" (torch's parametrize API: parametrizations.weight.original0/1) or "plain" (folded)."""
    keys = state_dict.keys()
    if any(k.endswith(".weight_g") for k in keys):
        return "g_v"
    if any(".parametrizations.weight.original0" in k for k in keys):
        return "parametrizations"
    return "plain"


def build_generator(h, state_dict: dict | None = None, seed: int = 0):
    """→ BigVGAN in eval mode with weight norm folded in (inference form), on the CPU in float32.
    `state_dict` may hold weight norm in either torch form, or have it removed already."""
    BigVGAN = bigvgan_package.model_module().BigVGAN

    torch.manual_seed(seed)
    form = _weight_norm_form(state_dict) if state_dict is not None else "g_v"
    if form == "parametrizations":  # same tensors, the older names
        state_dict = {k.replace(".parametrizations.weight.original0", ".weight_g")
                       .replace(".parametrizations.weight.original1", ".weight_v"): v for k, v in state_dict.items()}
    # The package prints progress on stdout and builds with the deprecated weight_norm API.
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = BigVGAN(h, use_cuda_kernel=False)
        if form == "plain":
            model.remove_weight_norm()
        if state_dict is not None:
            model.load_state_dict(state_dict)  # strict: a key missing or left over names the mismatch
        if form != "plain":
            model.remove_weight_norm()
    return model.eval()


def load_generator(directory: str | Path):
    directory = Path(directory)
    config, weights = directory / "config.json", directory / "bigvgan_generator.pt"
    for path in (config, weights):
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: a BigVGAN-v2 directory holds config.json and bigvgan_generator.pt")
    h = read_config(config)
    state = torch.load(weights, map_location="cpu", weights_only=True)
    return build_generator(h, state.get("generator", state)), h


def save_generator(model, h, directory: str | Path) -> None:
    """The package's format, for tests: the model's state dict as it is (with or without weight norm)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(dict(h), indent=2) + "\n")
    torch.save({"generator": model.state_dict()}, directory / "bigvgan_generator.pt")
