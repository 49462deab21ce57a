"""The feed-forward's first product with its GELU in one kernel: GELU(x @ weight.T + bias), the exact (erf) GELU
of the reference, on tiles of the product as cuBLAS's (tiles(): 32-64 frames by 64-128 channels a program).

A steady flow call is ~6,000 kernels of a few microseconds each (docs/benchmarks.md), 56 of them a GELU
in every Euler step. cuBLASLt's own GELU epilogue is the tanh approximation, not the reference's. So here the
product is Triton's, with the GELU on its float32 sum before the one rounding: on an H100 at the stack's call sizes
(256 → 1024; 160, 960 and 1,920 frames: calls of 1, 6 and 12 streams) 0.71x, 0.81x and 0.93x the time of cuBLAS's
product and PyTorch's GELU: ~0.7 ms of a ~30 ms flow call, predicted; whole calls measured 0-2.4 ms faster, within
their run-to-run spread (bench/studies/codec_fused_linear.py, bench/studies/codec_flow_profile.py; docs/benchmarks.md).

Not fused, measured and left (docs/benchmarks.md): the LayerNorms. After a product, a norm needs a
program to own whole output frames, which then streams all of the weight alone (1.3-1.8x slower than cuBLAS and a
per-frame kernel); before one, normalising each tile of the input as it is read keeps the tensor cores waiting
(q|k|v 2.1x, the feed-forward 1.4x at 960 frames). Nor with the norm taken out of the product (rstd · (x @ (W·gamma).T
- mean · c) + W @ beta: the raw frames' product, their statistics from the same loads) and the attention's output
product adding its residual and keeping the keys and values, a block in five kernels, not seven: those Triton
products took 10-12 us where cuBLAS's take ~4.4, so a 6-stream call was 11-49% slower alone and no faster beside the
llm (77-78 ms against 76-79), though it ran 1,120 kernels fewer (2026-11-27, norm_linear.py at 0db07d3).

On CPU (and with `FUSED = False`, to compare) PyTorch's product and GELU run. Shapes: x [B, T, K] with K contiguous,
weight [N, K] (nn.Linear's), bias [N] → [B, T, N].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.common import launch
from services.vocoder.codec import frame_ops

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (CI installs triton; the PyTorch form needs none)
    triton = None
else:
    from services.common.launch import inputs_ready

FUSED = True     # False: PyTorch's product, then its GELU (bench/studies/codec_flow_profile.py compares)
BLOCK_K = 64
TILE = None      # (frames, channels, warps) per program; None: tiles() (bench/studies/codec_fused_linear.py sweeps them)


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, T, K] → GELU(x @ weight.T + bias) [B, T, N], the exact GELU."""
    if FUSED and frame_ops.on_gpu(x):
        return kernel(x, weight, bias)
    return F.gelu(F.linear(x, weight, bias))


def tiles(M: int, N: int) -> tuple[int, int, int]:
    """(frames, channels, warps) per program: 64 x 64; 32 frames where that leaves under 100 programs (a call of one
    stream); 128 channels from ~4,000 frames. On an H100 the best of 8 tiles or within 0.3 us of it at 160-1,920
    frames, and 64 x 128 the best at 5,120 (15.6 us, where 64 x 64 took 17.2: slower than cuBLAS's 15.9)."""
    if TILE is not None:
        return TILE
    if M >= 4096:
        return 64, 128, 4
    return (32 if triton.cdiv(M, 64) * triton.cdiv(N, 64) < 100 else 64), 64, 4


def kernel(x, weight, bias=None):
    """The Triton kernel (on CPU tensors: Triton's interpreter, for the tests)."""
    B, T, K = x.shape
    N, M = weight.shape[0], B * T
    x2 = x.reshape(M, K)
    out = torch.empty(B, T, N, device=x.device, dtype=x.dtype)
    block_m, block_n, warps = tiles(M, N)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    pdl = launch.pdl(x)
    _linear_gelu[grid](x2, weight, bias if bias is not None else weight, out, M, N, K, x2.stride(0), weight.stride(0),
                       HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=block_n,
                       BLOCK_K=BLOCK_K, PDL=pdl, num_warps=warps, launch_pdl=pdl)
    return out


if triton is not None:
    @triton.jit
    def exact_gelu(h):
        """The reference's GELU, h · Φ(h) by erf (not the tanh form), on float32 sums."""
        return 0.5 * h * (1.0 + tl.math.erf(h * 0.7071067811865476))

    @triton.jit
    def _linear_gelu(X, W, BIAS, OUT, M, N, inner, sx, sw, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        inputs_ready(PDL)
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        row_ok, col_ok = offs_m < M, offs_n < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, inner, BLOCK_K):
            k_ok = (k0 + offs_k) < inner
            a = tl.load(X + offs_m[:, None] * sx + (k0 + offs_k)[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(W + offs_n[None, :] * sw + (k0 + offs_k)[:, None], mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)                                       # [BLOCK_K, BLOCK_N]: weight's rows as columns
            if IEEE:  # float32 inputs (the tests): no TF32 rounding
                acc = tl.dot(a, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, w, acc)
        if HAS_BIAS:
            acc += tl.load(BIAS + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        acc = exact_gelu(acc)
        tl.store(OUT + offs_m[:, None] * N + offs_n[None, :], acc.to(OUT.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])
