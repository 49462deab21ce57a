"""Products of few rows with a bf16 weight, as one Triton kernel that streams the weight: y = x @ wᵀ.

Why: a decode step is bound by reading the audio path's weights once (14 GB in bf16, DESIGN.md §5), and cuBLAS's
kernels read them at ~3.1 TB/s at 1-64 rows where the H200's copy runs at ~4.2 TB/s (docs/benchmarks.md,
roofline-2026-11-29): its step is 1.46x the bytes' time at batch 1. Here each program owns BLOCK_N output columns
for every row and walks K once, so each weight byte is read once and the few rows of x come from L2.

Two forms, chosen by the caller's config:
- DOT: the rows padded to BLOCK_M ≥ 16 on the tensor cores (mma), for 2-64 rows;
- no DOT (BLOCK_M = 1): one row, multiply-adds on the CUDA cores into a [BLOCK_N, BLOCK_K] float32 tile summed
  over K once at the end, so the loop has no reduction in it.

Both sum in float32 and round once to x's dtype, as cuBLAS does; the order of the sums differs, so results agree
with F.linear to bf16's rounding, not bit for bit. On compute capability 9+ the kernel launches while the one
before it still runs and waits for its inputs (services/common/launch.py), as the runner's other kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from services.common import launch
from services.common.launch import inputs_ready


@dataclass(frozen=True)
class StreamConfig:
    block_n: int
    block_k: int
    warps: int
    stages: int


@triton.jit
def _stream_matmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, x_stride, w_stride, y_stride,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          DOT: tl.constexpr, PDL: tl.constexpr):
    # Program j: y[:, j·BLOCK_N : (j+1)·BLOCK_N] = x [M, K] @ w [BLOCK_N, K]ᵀ. The weight's strip is read with
    # evict-first: each line is used once, and x's rows, read by every program, stay in L2.
    inputs_ready(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    col_ok = cols[:, None] < N
    w_rows = w_ptr + cols[:, None].to(tl.int64) * w_stride
    if DOT:
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows[:, None] < M
        x_rows = x_ptr + rows[:, None].to(tl.int64) * x_stride
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            k_ok = (k + ks)[None, :] < K
            x = tl.load(x_rows + k + ks[None, :], mask=row_ok & k_ok, other=0.0)
            w = tl.load(w_rows + k + ks[None, :], mask=col_ok & k_ok, other=0.0, eviction_policy="evict_first")
            acc = tl.dot(x, tl.trans(w), acc)
        tl.store(y_ptr + rows[:, None].to(tl.int64) * y_stride + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=row_ok & (cols[None, :] < N))
    else:
        # One row: tile [BLOCK_N, BLOCK_K] of products, summed over K after the loop.
        tile = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            k_ok = (k + ks) < K
            x = tl.load(x_ptr + k + ks, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_rows + k + ks[None, :], mask=col_ok & k_ok[None, :], other=0.0,
                        eviction_policy="evict_first")
            tile += w.to(tl.float32) * x[None, :]
        tl.store(y_ptr + cols, tl.sum(tile, axis=1).to(y_ptr.dtype.element_ty), mask=cols < N)


# Rows up to this many go through the kernel (decode steps and short prefills); more rows make a product whose
# FLOPs, not its bytes, set its time, and cuBLAS's tiles are the better there.
STREAM_ROWS = 64


def default_config(m: int, n: int, k: int) -> StreamConfig:
    """The config for an [m, k] @ [n, k]ᵀ product: enough programs to keep every multiprocessor's loads in flight
    (≥ 2 a multiprocessor at N = 4096) with each strip walked in 16 KB steps."""
    block_n = 16 if n <= 8192 else 64
    if m == 1:
        return StreamConfig(block_n=block_n, block_k=512 if block_n == 16 else 128, warps=4, stages=1)
    return StreamConfig(block_n=block_n, block_k=256 if block_n == 16 else 128, warps=4, stages=4)


def stream_matmul(x: torch.Tensor, w: torch.Tensor, config: StreamConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (M ≤ STREAM_ROWS), w [N, K] (both with a contiguous last dim, one dtype) → y [M, N] = x @ wᵀ in x's
    dtype. Grid and arguments depend only on shapes: capturable in a CUDA graph."""
    assert x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1], (x.shape, w.shape)
    assert x.stride(-1) == 1 and w.stride(-1) == 1 and x.dtype == w.dtype
    m, k = x.shape
    n = w.shape[0]
    assert m <= STREAM_ROWS, f"{m} rows: stream_matmul is for up to {STREAM_ROWS}"
    cfg = config or default_config(m, n, k)
    y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    dot = m > 1
    _stream_matmul_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=max(16, triton.next_power_of_2(m)) if dot else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        DOT=dot, PDL=(pdl := launch.pdl(x)), launch_pdl=pdl, num_warps=cfg.warps, num_stages=cfg.stages)
    return y
