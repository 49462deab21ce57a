"""Loading a state dict by name, strictly: every tensor the model has, none it lacks, each of its shape. A missing,
extra or misshapen tensor is refused with its name (CheckpointMismatch), so a wrong file fails at start, saying
what is wrong, rather than loading half or speaking noise."""

from __future__ import annotations

import torch
from torch import nn

SHOWN = 8  # names listed per kind of mismatch


class CheckpointMismatch(ValueError):
    pass


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Every tensor by name (cast to the model's dtype), or CheckpointMismatch naming what is missing, extra or
    misshapen (`what`: the file, for the message)."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    misshapen = sorted(f"{k} {tuple(state[k].shape)} (expected {tuple(expected[k].shape)})"
                       for k in set(state) & set(expected) if state[k].shape != expected[k].shape)
    problems = [f"{kind} {len(names)}: {', '.join(names[:SHOWN])}{' ...' if len(names) > SHOWN else ''}"
                for kind, names in (("missing", missing), ("unexpected", extra), ("misshapen", misshapen)) if names]
    if problems:
        raise CheckpointMismatch(f"{what}: " + "; ".join(problems))
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
