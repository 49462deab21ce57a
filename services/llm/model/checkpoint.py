"""HF-format checkpoints: config.json + safetensors (one file or shards with an index), official keys.

Keys are matched strictly by name (a missing or unexpected one is refused, listed). Each path through the model is a
Qwen3 model: qwen3_map.py maps a Qwen3ForCausalLM's names to ours, path by path, for a reader with Qwen3-shaped
weights; tests/test_llm_reference.py holds our logits to transformers' Qwen3 through that map."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from services.llm.model.config import MossSpeechConfig
from services.llm.model.model import MossSpeechForCausalLM

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(ValueError):
    """The directory does not hold a loadable MOSS-Speech checkpoint."""


def save_pretrained(model: MossSpeechForCausalLM, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.cfg.save(directory / "config.json")
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / s for s in shards]
    single = directory / "model.safetensors"
    if single.exists():
        return [single]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no model.safetensors, index or *.safetensors files")
    return files


def load_pretrained(
    directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> MossSpeechForCausalLM:
    """Build the model from config.json and fill it from the safetensors files, strictly by key."""
    directory = Path(directory)
    if not (directory / "config.json").exists():
        raise CheckpointError(f"{directory}: config.json not found")
    cfg = MossSpeechConfig.from_json(directory / "config.json")
    dtype = dtype or DTYPES.get(cfg.torch_dtype, torch.float32)
    with torch.device("meta"):
        model = MossSpeechForCausalLM(cfg)
    expected = model.state_dict()
    state: dict[str, torch.Tensor] = {}
    for path in _weight_files(directory):
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():
                state[key] = f.get_tensor(key).to(dtype)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{directory}: weights do not match config.json: missing {missing[:5]}"
            f"{' …' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}{' …' if len(unexpected) > 5 else ''}"
        )
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise CheckpointError(f"{directory}: {key} has shape {tuple(tensor.shape)}, config says {tuple(expected[key].shape)}")
    model.load_state_dict(state, assign=True)
    return model.eval()


def random_model(cfg: MossSpeechConfig, device="cpu", dtype: torch.dtype | None = None, seed: int = 0):
    """A model with random weights (the demo's and the tests' default), reproducible by seed."""
    torch.manual_seed(seed)
    dtype = dtype or DTYPES.get(cfg.torch_dtype, torch.float32)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the target dtype: 9.1B parameters in float32 are 36 GB
    try:
        with torch.device(device):
            model = MossSpeechForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()
