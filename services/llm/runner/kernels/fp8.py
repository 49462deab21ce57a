"""A row's FP8 quantization as one Triton kernel (runner/fp8.py's quantize_rows_reference: the same numbers).

Torch's version is four kernels (abs-max, divide, clamp, cast) for each of a step's ~150 GEMM inputs; in a captured
decode step each launch still costs ~2 µs of GPU time. One program per row: its largest magnitude, then the row
divided by it over e4m3's range, stored with its scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.llm.runner.fp8_format import FP8, FP8_MAX, TINY


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


# ---- decode products: FP8 weights streamed, few rows ------------------------------------------------------------
# cuBLASLt's FP8 product is slow at decode's few rows: the audio path's four layer products took 4.5 ms at 1-64 rows
# on a whole H100 (bf16: 5.3 ms), and 7.0 ms on the llm's 32 multiprocessors under MPS, slower than bf16's 6.0
# (bench/studies/fp8_gemm.py). A decode product is bound by reading its weight once: here each program streams a
# [BLOCK_N, K] strip of FP8 weight and multiplies the few quantized rows against it on FP8 tensor cores: 3.3-3.7 ms
# whole, 4.6-6.1 ms under MPS. (Widening the weight to bf16 instead, to keep the rows unquantized, cost more
# than it saved under MPS: 9-15 ms, the widening being ALU work on every weight element.)

def decode_configs():
    """The decode kernel's autotuning space (bench/studies/gpu_neighbors.py's bf16 stand-in tunes over the same)."""
    return [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=4, num_stages=s)
            for bn in (32, 64, 128) for bk in (128, 256) for s in (3, 5)]


@triton.autotune(configs=decode_configs(), key=["N", "K", "BLOCK_M"])
@triton.jit
def _decode_kernel(x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, M, N, K, x_stride, w_stride, y_stride,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # Program j: y[:, j·BLOCK_N : (j+1)·BLOCK_N] = (x [M, K] · xs [M]) @ (w [BLOCK_N, K] · ws [BLOCK_N])ᵀ, x and w FP8,
    # float32 accumulation; rows past M are masked (BLOCK_M ≥ 16: the tensor cores' smallest tile).
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * x_stride
    w_rows = w_ptr + cols[:, None].to(tl.int64) * w_stride
    row_ok, col_ok = rows[:, None] < M, cols[:, None] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_ok = (k + ks)[None, :] < K
        x = tl.load(x_rows + k + ks[None, :], mask=row_ok & k_ok, other=0.0)
        w = tl.load(w_rows + k + ks[None, :], mask=col_ok & k_ok, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    acc = acc * tl.load(ws_ptr + cols, mask=cols < N, other=0.0)[None, :]
    acc = acc * tl.load(xs_ptr + rows, mask=rows < M, other=0.0)[:, None]
    tl.store(y_ptr + rows[:, None].to(tl.int64) * y_stride + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok & (cols[None, :] < N))


def decode_matmul(q: torch.Tensor, q_scale: torch.Tensor, data: torch.Tensor, scale: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """Quantized rows q [M, K] FP8 (M ≤ 64) with q_scale [M, 1], weight data [N, K] FP8 with scale [1, N] →
    (q · q_scale) @ (data · scale)ᵀ [M, N] in out_dtype: what torch._scaled_mm computes, for few rows."""
    assert q.dim() == 2 and q.stride(-1) == 1 and data.stride(-1) == 1 and q.shape[1] == data.shape[1]
    m, k = q.shape
    n = data.shape[0]
    y = torch.empty(m, n, dtype=out_dtype, device=q.device)
    _decode_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
        q, q_scale, data, scale, y, m, n, k, q.stride(0), data.stride(0), y.stride(0),
        BLOCK_M=max(16, triton.next_power_of_2(m)))
    return y
