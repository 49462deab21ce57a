"""A module's parameters and buffers moved to a device in one host → device copy.

`module.to(device, dtype)` copies tensor by tensor: a synchronous copy from pageable memory and a cast for each of
the codec's flow's ~1,000 tensors. Alone that took an H200's vocoder 0.3-1.0 s; at a warm start or after a fault, beside
the llm's and the encoder's starts under MPS, 4.2-4.6 s, on the stack's critical path (docs/benchmarks.md,
starts-2026-11-30). Here the cast is done on the host, every tensor is packed into one pinned buffer, that buffer is
copied once, and each tensor gets its own device tensor (a copy on the device, queued without waiting): one transfer
that the host waits for, whatever the number of tensors.
"""

from __future__ import annotations

import torch
from torch import nn

ALIGN = 256  # bytes: every tensor's slice starts on a boundary its dtype's vectorised copies like


def move_module(module: nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> nn.Module:
    """What module.to(device=device, dtype=dtype) gives (floating-point tensors cast to dtype, the rest as they
    are; a tensor shared by several submodules stays shared), in one host → device copy; returns module."""
    device = torch.device(device)
    if all(t.device.type != "cpu" for t in module.state_dict().values()):  # not on the host: nothing to pack
        return module.to(device=device, dtype=dtype)
    entries = []  # (owner, name, is_parameter, tensor): every parameter and buffer, each owner's own
    for owner in module.modules():
        entries += [(owner, name, True, t) for name, t in owner._parameters.items() if t is not None]
        entries += [(owner, name, False, t) for name, t in owner._buffers.items() if t is not None]
    host: dict[int, torch.Tensor] = {}  # id(tensor) → its host form in the target dtype, contiguous
    for _, _, _, t in entries:
        if id(t) not in host:
            cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
            host[id(t)] = t.detach().to("cpu", cast).contiguous()
    offsets, total = {}, 0
    for key, t in host.items():
        offsets[key] = total
        total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    staging = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    for key, t in host.items():
        staging[offsets[key] : offsets[key] + t.numel() * t.element_size()].view(t.dtype).copy_(t.view(-1))
    on_device = staging.to(device, non_blocking=True)  # the one transfer

    moved: dict[int, torch.Tensor] = {}
    for owner, name, is_parameter, t in entries:
        if id(t) not in moved:
            h = host[id(t)]
            piece = on_device[offsets[id(t)] : offsets[id(t)] + h.numel() * h.element_size()]
            moved[id(t)] = piece.view(h.dtype).view(h.shape).clone()  # its own allocation: the packed one is freed
            if is_parameter:  # the same Parameter, its data replaced, as .to() does: references to it stay good
                t.data = moved[id(t)]
        if not is_parameter:
            owner._buffers[name] = moved[id(t)]
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # as .to() returns: the tensors are there
    return module
