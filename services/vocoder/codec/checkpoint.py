"""The codec decoder's weights: a directory of `codec.json`, `flow.pt` and `hift.pt`.

`flow.pt` and `hift.pt` are the reference's state dicts as torch saved them (the official files load by name).
Weight norm, in either of torch's forms (`weight_g`/`weight_v`, or `parametrizations.weight.original0/1`),
is folded into plain weights first. Then every tensor must match the model built from codec.json: a missing,
extra or misshapen tensor is refused with its name (CheckpointMismatch).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from services.common.checkpoint import CheckpointMismatch, load_strict
from services.vocoder.codec.config import CodecConfig, read_config, write_config
from services.vocoder.codec.flow import CausalMaskedDiffWithXvec
from services.vocoder.codec.hift import HiFTGenerator

FILES = ("codec.json", "flow.pt", "hift.pt")


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """weight = g · v / ‖v‖ (norm over every axis but the first, torch's default), under the plain name."""
    out, pairs = {}, {}
    for key, value in state.items():
        for g_suffix, v_suffix in ((".weight_g", ".weight_v"),
                                   (".parametrizations.weight.original0", ".parametrizations.weight.original1")):
            if key.endswith(g_suffix) or key.endswith(v_suffix):
                stem = key[: -len(g_suffix)] if key.endswith(g_suffix) else key[: -len(v_suffix)]
                pairs.setdefault(stem, {})["g" if key.endswith(g_suffix) else "v"] = value
                break
        else:
            out[key] = value
    for stem, gv in pairs.items():
        if set(gv) != {"g", "v"}:
            raise CheckpointMismatch(f"{stem}: weight norm needs both its g and v tensors, found only {''.join(gv)}")
        v = gv["v"].float()
        norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
        out[f"{stem}.weight"] = (gv["g"].float() * v / norm).to(gv["v"].dtype)
    return out


def load_into(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Weight norm folded, then every tensor by name (services/common/checkpoint.py)."""
    load_strict(model, fold_weight_norm(state), what)


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  a truncated or foreign file: say which
        raise CheckpointMismatch(f"{path}: not a torch state dict ({exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointMismatch(f"{path}: not a state dict of tensors")
    return state


def load_codec(directory: str | Path) -> tuple[CausalMaskedDiffWithXvec, HiFTGenerator, CodecConfig]:
    directory = Path(directory)
    for name in FILES:
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory / name} not found: a codec directory holds {', '.join(FILES)}")
    cfg = read_config(directory / "codec.json")
    flow, hift = CausalMaskedDiffWithXvec(cfg.flow), HiFTGenerator(cfg.hift)
    load_into(flow, _read_state(directory / "flow.pt"), str(directory / "flow.pt"))
    load_into(hift, _read_state(directory / "hift.pt"), str(directory / "hift.pt"))
    return flow.eval(), hift.eval(), cfg


def random_codec(cfg: CodecConfig, seed: int = 0) -> tuple[CausalMaskedDiffWithXvec, HiFTGenerator]:
    """The architecture with random weights, scaled so that its outputs look like speech's ranges: a log-mel
    around -6 with unit spread, and an F0 of a few hundred Hz (voiced)."""
    torch.manual_seed(seed)
    flow, hift = CausalMaskedDiffWithXvec(cfg.flow), HiFTGenerator(cfg.hift)
    with torch.no_grad():
        for name, p in flow.named_parameters():
            if name.endswith("pos_bias_u") or name.endswith("pos_bias_v"):
                nn.init.xavier_uniform_(p)
        proj = flow.decoder.estimator.final_proj
        proj.weight.mul_(0.1)
        hift.f0_predictor.classifier.bias.fill_(200.0)
    return flow.eval(), hift.eval()


def save_codec(flow: CausalMaskedDiffWithXvec, hift: HiFTGenerator, cfg: CodecConfig, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_config(cfg, directory / "codec.json")
    torch.save(flow.state_dict(), directory / "flow.pt")
    torch.save(hift.state_dict(), directory / "hift.pt")
