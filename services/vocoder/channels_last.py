"""BigVGAN's convolutions on channels-last activations: [B, C, 1, T] tensors with the channels contiguous.

Why: in bf16 on Hopper cuDNN runs these convolutions as NHWC kernels. Fed the package's [B, C, T] tensors it
transposes every input to NHWC and every output back: 329 layout transforms, 41% of a first chunk's kernel time
on an H100 (docs/benchmarks.md, "where a first chunk's time goes"). PyTorch makes a 3-D conv input contiguous
before its 1-D→2-D view (to keep permuted 1-D inputs off NHWC), so the layout has to be a real 4-D one: each
Conv1d / ConvTranspose1d becomes the 2-D convolution of height 1 with a channels-last weight, and the tensors
between them stay [B, C, 1, T] channels-last (elementwise ops keep their inputs' layout, FusedActivation1d
reads and writes it). The package's own forward runs unchanged on them.

Swap after `fuse_activations` (the eager Activation1d only takes [B, C, T]) and after casting the weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _weight4d(weight: torch.Tensor) -> torch.Tensor:
    """[O, I, K] (transposed: [I, O, K]) → [O, I, 1, K] in channels-last memory, the layout cuDNN's NHWC kernels
    read (a weight in any other layout would be converted on every call)."""
    return weight.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)


class ChannelsLastConv1d(nn.Module):
    """nn.Conv1d over x [B, C_in, 1, T] channels-last → [B, C_out, 1, T'] channels-last, same weights."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError(f"{conv}: only numeric zero padding is swapped")
        self.weight = nn.Parameter(_weight4d(conv.weight), requires_grad=False)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach(), requires_grad=False)
        self.stride, self.padding = (1, conv.stride[0]), (0, conv.padding[0])
        self.dilation, self.groups = (1, conv.dilation[0]), conv.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ChannelsLastConvTranspose1d(nn.Module):
    """nn.ConvTranspose1d over x [B, C_in, 1, T] channels-last → [B, C_out, 1, T'] channels-last."""

    def __init__(self, conv: nn.ConvTranspose1d):
        super().__init__()
        if conv.padding_mode != "zeros":
            raise ValueError(f"{conv}: only zero padding is swapped")
        self.weight = nn.Parameter(_weight4d(conv.weight), requires_grad=False)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach(), requires_grad=False)
        self.stride, self.padding = (1, conv.stride[0]), (0, conv.padding[0])
        self.output_padding, self.dilation = (0, conv.output_padding[0]), (1, conv.dilation[0])
        self.groups = conv.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


def to_channels_last(model: nn.Module) -> int:
    """Swap every Conv1d / ConvTranspose1d of `model` for its channels-last form → how many were swapped. The
    model then takes [B, C, 1, T] channels-last input; every Activation1d in it must be fused already."""
    eager = [name for name, m in model.named_modules() if type(m).__name__ == "Activation1d"]
    if eager:
        raise ValueError(f"fuse the activations first: {eager[0]} is eager and takes only [B, C, T]")
    swaps = [(name, ChannelsLastConv1d(m) if isinstance(m, nn.Conv1d) else ChannelsLastConvTranspose1d(m))
             for name, m in model.named_modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    for name, module in swaps:
        parent, _, attr = name.rpartition(".")
        container = model.get_submodule(parent) if parent else model
        setattr(container, attr, module)
    return len(swaps)


def channels_last_input(batch: int, channels: int, frames: int, **kw) -> torch.Tensor:
    """A zeroed [batch, channels, 1, frames] channels-last tensor (kw: dtype, device)."""
    return torch.zeros(batch, 1, frames, channels, **kw).permute(0, 3, 1, 2)
