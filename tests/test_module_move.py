"""services/common/module_move.py: a module moved in one copy is what module.to() makes of it."""

from __future__ import annotations

import torch
from torch import nn

from services.common.module_move import move_module


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.proj = nn.Linear(6, 11)
        self.proj.weight = self.embed.weight  # one tensor, two owners
        self.norm = nn.LayerNorm(6)
        self.register_buffer("steps", torch.arange(5))  # an integer buffer: not cast
        self.register_buffer("scale", torch.randn(3, 4).t())  # not contiguous
        self.frozen = nn.Parameter(torch.randn(7), requires_grad=False)


def test_a_moved_module_holds_what_to_gives_it_and_keeps_its_ties():
    torch.manual_seed(0)
    a = Tied()
    b = Tied()
    b.load_state_dict(a.state_dict())
    want = a.to(dtype=torch.bfloat16)
    weight = b.norm.weight
    got = move_module(b, torch.device("cpu"), torch.bfloat16)
    assert got is b and got.norm.weight is weight  # the same Parameter objects, as .to() keeps them
    for (name, x), (_, y) in zip(want.state_dict().items(), got.state_dict().items(), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
    assert got.steps.dtype == torch.int64 and got.scale.is_contiguous()
    assert got.proj.weight is got.embed.weight and isinstance(got.proj.weight, nn.Parameter)
    assert not got.frozen.requires_grad and got.norm.weight.requires_grad
    names = [n for n, _ in got.named_parameters()]
    assert names == [n for n, _ in want.named_parameters()]
    x = torch.tensor([[1, 4, 9]])
    assert torch.equal(got.proj(got.norm(got.embed(x))), want.proj(want.norm(want.embed(x))))


def test_each_moved_tensor_has_its_own_storage():
    m = move_module(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), torch.device("cpu"))
    pointers = {p.untyped_storage().data_ptr() for p in m.parameters()}
    assert len(pointers) == 4  # not views of the packed buffer: freeing it frees nothing they hold
