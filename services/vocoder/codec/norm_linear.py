"""A transformer block's LayerNorms and residuals inside its matrix products: five kernels a block instead of seven.

A flow call is ~5,600 kernels, a transformer block's seven of them in every Euler step (q|k|v, attention, the output
product, a per-frame kernel for the residual and norm3, the feed-forward's two products, a per-frame kernel for the
residual and the next norm1). Beside the llm each kernel costs the vocoder ~8 us more than alone, whatever its work
(docs/benchmarks.md, issue 23). Here a block is:

    q|k|v = norm1(x) @ Wqkv           `norm_linear`: the norm's statistics gathered while the product runs
    attention                         (chunk_attention.py)
    x2 = o @ Wout + bout + x           `linear_residual`: also stores x2 + bff2, and keeps the keys and values
    h = GELU(norm3(x2) @ W1 + b1)      `norm_linear`
    x3 = h @ W2 + (x2 + bff2)          cuBLAS's product, adding its input matrix (addmm)

**A norm inside the product that follows it, with no pass before it.** A norm needs a frame's mean and variance
before any channel can be scaled, and normalising each tile as it is read kept the tensor cores waiting (q|k|v 2.1x
slower, measured: fused_linear.py). But LayerNorm is affine per frame, so it can be taken out of the product:

    norm(x) @ W.T = rstd · (x @ W'.T - mean · c) + s,   W' = W · gamma (per input channel), c = W' summed over its
                                                         inputs, s = W @ beta (+ the product's bias)

The product runs on the raw frames against W' (tensor cores, as a plain product); the same loads give each frame's
sum and sum of squares, and each tile of W' its column sums c; the epilogue applies mean and rstd. Every program still
owns a tile of frames by a tile of channels (a norm *after* a product would need whole frames: 1.3-1.8x slower).
W' is made once (`fold`, bf16 as the weights); c summed from the W' the product reads, so the identity holds to
float32 summation; s in float32. A program reads whole frames (256 channels) at once, so a frame's statistics are
one reduction. The variance is E[x²] - mean² in float32: the residual stream's frames are far from
constant, so nothing cancels that float32 cannot hold.

The keys and values a stream's history keeps (history.py) go into its ring after the attention has read it: in the
output product's kernel, the first kernel after the attention (frame_ops.keep_frames).

On CPU, and with `FOLDED = False`, the block runs as before (frame_ops.frame_norm between cuBLAS's products). Shapes:
frames are rows, x [B, T, K] with K contiguous, weights [N, K] (nn.Linear's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from services.common import launch
from services.vocoder.codec import frame_ops
from services.vocoder.codec.fused_linear import BLOCK_K, tiles

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (CI installs triton; the PyTorch forms need none)
    triton = None
else:
    from services.common.launch import inputs_ready
    from services.vocoder.codec.frame_ops import keep_frames

FOLDED = True  # False: the norms in frame_ops' per-frame kernels (bench/codec_flow_profile.py compares)


@dataclass(frozen=True)
class FoldedNorm:
    """norm(x) @ weight.T + bias as the kernel computes it: weight [N, K] = the product's weight times the norm's
    gamma per input channel (the dtype of the weights); colsum [N] float32: that weight summed over its inputs, as
    stored; shift [N] float32 = the product's weight @ beta + bias; the norm's eps."""
    weight: torch.Tensor
    colsum: torch.Tensor
    shift: torch.Tensor
    eps: float


def fold(norm: nn.LayerNorm, weight: torch.Tensor, bias: torch.Tensor | None = None) -> FoldedNorm:
    w = weight.float()
    shift = w @ norm.bias.float() + (bias.float() if bias is not None else 0.0)
    folded = (w * norm.weight.float()[None, :]).to(weight.dtype).contiguous()
    return FoldedNorm(folded, folded.float().sum(1).contiguous(), shift.contiguous(), norm.eps)


def active(x: torch.Tensor) -> bool:
    """Whether a block over x runs in these kernels (on CUDA with Triton, unless FOLDED is off)."""
    return FOLDED and frame_ops.on_gpu(x)


def norm_linear(x: torch.Tensor, folded: FoldedNorm, gelu: bool = False) -> torch.Tensor:
    """x [B, T, K] → norm(x) @ weight.T + bias [B, T, N], and its exact GELU if `gelu` (the Triton kernel; on CPU
    tensors Triton's interpreter, for the tests)."""
    B, T, K = x.shape
    N, M = folded.weight.shape[0], B * T
    x2 = x.reshape(M, K)
    out = torch.empty(B, T, N, device=x.device, dtype=x.dtype)
    block_m, block_n, warps = tiles(M, N)
    pdl = launch.pdl(x)
    _norm_linear[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
        x2, folded.weight, folded.colsum, folded.shift, out, M, N, K, x2.stride(0), folded.weight.stride(0), folded.eps,
        GELU=gelu, IEEE=x.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=norm_block_k(K), PDL=pdl,
        num_warps=warps, launch_pdl=pdl)
    return out


def norm_block_k(K: int) -> int:
    """The inputs a norm_linear program reads at once: the whole frame up to 256 channels (the estimator's), so that
    its statistics are one reduction, not one per step of the product."""
    return min(triton.next_power_of_2(K), 256) if K > BLOCK_K else BLOCK_K


def linear_residual(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                    shift: torch.Tensor, keep: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, T, K] → (out = x @ weight.T + bias + residual, out + shift) [B, T, N] each: the second is what the next
    product adds to its own (x3 = h @ W2.T + out + bff2). keep: frame_ops.frame_norm's (keys and values into a
    stream's ring), done by the programs of the first column of tiles."""
    B, T, K = x.shape
    N, M = weight.shape[0], B * T
    x2, res = x.reshape(M, K), residual.reshape(M, N)
    out, second = torch.empty(B, T, N, device=x.device, dtype=x.dtype), torch.empty(B, T, N, device=x.device, dtype=x.dtype)
    tensors, strides, ring, heads, head_d = frame_ops.keep_arguments(keep, x2)
    block_m, block_n, warps = tiles(M, N)
    pdl = launch.pdl(x)
    _linear_residual[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
        x2, weight, bias, res, shift, out, second, *tensors, M, N, K, T, x2.stride(0), weight.stride(0), res.stride(0),
        *strides, ring, KEEP=keep is not None, HEADS=heads, HEAD_D=head_d, IEEE=x.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K, PDL=pdl, num_warps=warps, launch_pdl=pdl)
    return out, second


def reference_norm_linear(x, norm, weight, bias=None, gelu=False):
    """PyTorch's form, op by op (the tests' oracle)."""
    out = F.linear(norm(x), weight, bias)
    return F.gelu(out) if gelu else out


if triton is not None:
    @triton.jit
    def _norm_linear(X, W, COLSUM, SHIFT, OUT, M, N, inner, sx, sw, eps, GELU: tl.constexpr, IEEE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        inputs_ready(PDL)
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        row_ok, col_ok = offs_m < M, offs_n < N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        total = tl.zeros([BLOCK_M], dtype=tl.float32)     # each frame's sum and sum of squares
        squares = tl.zeros([BLOCK_M], dtype=tl.float32)
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
            af = a.to(tl.float32)
            total += tl.sum(af, 1)
            squares += tl.sum(af * af, 1)
        mean = total / inner
        rstd = 1.0 / tl.sqrt(tl.maximum(squares / inner - mean * mean, 0.0) + eps)
        colsum = tl.load(COLSUM + offs_n, mask=col_ok, other=0.0)   # c: W' summed over its inputs
        shift = tl.load(SHIFT + offs_n, mask=col_ok, other=0.0)
        acc = rstd[:, None] * (acc - mean[:, None] * colsum[None, :]) + shift[None, :]
        if GELU:
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        tl.store(OUT + offs_m[:, None] * N + offs_n[None, :], acc.to(OUT.dtype.element_ty),
                 mask=row_ok[:, None] & col_ok[None, :])

    @triton.jit
    def _linear_residual(X, W, BIAS, RES, SHIFT, OUT, OUT2, K, V, KR, VR, KEEP_ROWS, AT, LENGTHS, M, N, inner, T,
                         sx, sw, s_res, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, skr_r, skr_h, skr_t, svr_r, svr_h, svr_t,
                         ring, KEEP: tl.constexpr, HEADS: tl.constexpr, HEAD_D: tl.constexpr, IEEE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
        inputs_ready(PDL)  # (the attention, which read the ring, has finished: keeping may overwrite it)
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        row_ok, col_ok = offs_m < M, offs_n < N
        if KEEP:
            if tl.program_id(1) == 0:
                keep_frames(offs_m, row_ok, T, K, V, KR, VR, KEEP_ROWS, AT, LENGTHS, sk_b, sk_h, sk_t, sv_b, sv_h,
                            sv_t, skr_r, skr_h, skr_t, svr_r, svr_h, svr_t, ring, HEADS, HEAD_D)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, inner, BLOCK_K):
            k_ok = (k0 + offs_k) < inner
            a = tl.load(X + offs_m[:, None] * sx + (k0 + offs_k)[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(W + offs_n[None, :] * sw + (k0 + offs_k)[:, None], mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)
            if IEEE:
                acc = tl.dot(a, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, w, acc)
        ok = row_ok[:, None] & col_ok[None, :]
        acc += tl.load(BIAS + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        acc += tl.load(RES + offs_m[:, None] * s_res + offs_n[None, :], mask=ok, other=0.0).to(tl.float32)
        out = acc.to(OUT.dtype.element_ty)
        tl.store(OUT + offs_m[:, None] * N + offs_n[None, :], out, mask=ok)
        # the stored sum plus the next product's bias, as PyTorch would add them from memory
        second = out.to(tl.float32) + tl.load(SHIFT + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(OUT2 + offs_m[:, None] * N + offs_n[None, :], second.to(OUT2.dtype.element_ty), mask=ok)
