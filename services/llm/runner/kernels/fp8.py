"""A row's FP8 quantization as one Triton kernel (runner/fp8.py's quantize_rows_reference: the same numbers).

Torch's version is four kernels (abs-max, divide, clamp, cast) for each of a step's ~150 GEMM inputs; in a captured
decode step each launch still costs ~2 µs of GPU time. One program per row: its largest magnitude, then the row
divided by it over e4m3's range, stored with its scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.llm.runner.fp8 import FP8, FP8_MAX, TINY


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, x_stride, q_stride, k, fp8_max, tiny, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < k
    v = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(v), axis=0), tiny) / fp8_max
    q = tl.minimum(tl.maximum(v / scale, -fp8_max), fp8_max)
    tl.store(q_ptr + row * q_stride + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (last dim contiguous) → (q [M, K] FP8, scale [M, 1] float32), x ≈ q · scale."""
    assert x.dim() == 2 and x.stride(-1) == 1
    m, k = x.shape
    q = torch.empty(m, k, dtype=FP8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(k)
    _quantize_rows_kernel[(m,)](x, q, scale, x.stride(0), q.stride(0), k, FP8_MAX, TINY, BLOCK=block,
                                num_warps=max(1, min(16, block // 512)))
    return q, scale
