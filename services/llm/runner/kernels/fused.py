"""Fused elementwise Triton kernels for one decoder layer: ~4 launches instead of ~40.

In a CUDA graph of a 40-layer decode step every tiny kernel still costs ~2 µs of GPU time, so the reference's
chains of small ops (RMSNorm as 5 ops, RoPE recomputing cos/sin per layer, silu then mul, the KV-cache scatter)
are fused here; on compute capability 9+ each launches while the kernel before it still runs
(services/common/launch.py). Every wrapper launches with a grid that depends only on tensor shapes and never syncs
with the host, so all of them can be captured in a CUDA graph.

Numerics follow services/llm/model/model.py: math in fp32, rounding to the model dtype exactly where the
reference rounds (after the residual add, after each RMSNorm, after RoPE). Rows must have a contiguous last dim.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.common import launch
from services.common.launch import inputs_ready


def _warps(block: int) -> int:
    # ~8 elements per thread, at most 8 warps (hidden 4096 → 8 warps; tiny test shapes → 1).
    return max(1, min(8, block // 256))


# ---------------------------------------------------------------------------------------------------------------
# RMSNorm, optionally fused with the residual add


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, x_stride, res_stride, out_stride, hidden, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    inputs_ready(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    v = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        # New residual stream r = x + residual, rounded to the model dtype (as `x + attn(...)` is in the
        # reference); the norm then reads the rounded value.
        r_ptrs = res_ptr + row * res_stride + offs
        r = v + tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        r = r.to(res_ptr.dtype.element_ty)
        tl.store(r_ptrs, r, mask=mask)
        v = r.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(v * v, axis=0) / hidden + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + offs, v * rstd * w, mask=mask)  # store casts to out's dtype


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             out: torch.Tensor | None = None):
    """x [N, hidden], weight [hidden] → out [N, hidden] (x's dtype) = RMSNorm(x).

    With `residual` [N, hidden] (x's dtype): residual ← x + residual in place, out = RMSNorm(new residual);
    returns (out, residual). `out` may be x itself (each row is read fully before it is written).
    """
    assert x.dim() == 2 and x.stride(-1) == 1 and weight.shape == (x.shape[1],) and weight.is_contiguous()
    n, hidden = x.shape
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    assert out.shape == x.shape and out.stride(-1) == 1
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(-1) == 1
    res = residual if residual is not None else x  # dummy pointer when HAS_RESIDUAL is off
    if n > 0:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(n,)](x, res, weight, out, x.stride(0), res.stride(0), out.stride(0), hidden, eps,
                               HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_warps(block),
                               PDL=(pdl := launch.pdl(x)), launch_pdl=pdl)
    return out if residual is None else (out, residual)


# ---------------------------------------------------------------------------------------------------------------
# RoPE table


def rope_cache(head_dim: int, max_position: int, theta: float, device) -> torch.Tensor:
    """→ float32 [max_position, head_dim // 2, 2]: (cos, sin) of each position's angle per frequency.

    Computed once with the same torch expressions as model.py `rotate_neox`, on the same device, so the
    table equals the reference's per-layer cos/sin bit for bit in float32.
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    positions = torch.arange(max_position, device=device)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [max_position, head_dim // 2]
    return torch.stack([angles.cos(), angles.sin()], -1).contiguous()


# ---------------------------------------------------------------------------------------------------------------
# q/k per-head RMSNorm + RoPE, K/V scattered into the paged pool


@triton.jit
def _norm_rope(x1, x2, w_ptr, offs, mask, cos, sin, D: tl.constexpr, eps, dtype):
    """Heads [HEADS, D/2] twice (each head's two halves, fp32) → RMSNorm over D (rounded to the model dtype as the
    reference's RMSNorm output is), then NeoX RoPE: out = x * cos + cat(-x2, x1) * sin."""
    rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)[:, None]
    w1 = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(w_ptr + D // 2 + offs, mask=mask, other=0.0).to(tl.float32)[None, :]
    x1 = (x1 * rstd * w1).to(dtype).to(tl.float32)
    x2 = (x2 * rstd * w2).to(dtype).to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit(do_not_specialize=["layer"])  # one compiled variant for all 40 layers
def _qk_norm_rope_store_kernel(qkv_ptr, qw_ptr, kw_ptr, pos_ptr, cs_ptr, kv_ptr, slot_ptr, q_ptr,
                               qkv_stride, q_stride_n, q_stride_h,
                               kv_s0, kv_s1, kv_s2, kv_s3, kv_s4,
                               layer, block_size, eps,
                               H: tl.constexpr, KH: tl.constexpr, D: tl.constexpr, HALF_BLOCK: tl.constexpr,
                               H_BLOCK: tl.constexpr, KH_BLOCK: tl.constexpr, PDL: tl.constexpr):
    inputs_ready(PDL)
    # Grid (N,): program n handles row n's H q heads, then its KH k heads with their v heads, each as [heads, D/2]
    # tiles. Each head is loaded as two halves so that NeoX's rotate (cat(-x2, x1)) needs no shuffle.
    n = tl.program_id(0).to(tl.int64)
    half: tl.constexpr = D // 2
    offs = tl.arange(0, HALF_BLOCK)
    dmask = offs < half
    row = qkv_ptr + n * qkv_stride  # q heads, then k heads, then v heads: contiguous in qkv
    dtype = qkv_ptr.dtype.element_ty
    # table [max_position, D/2, 2] holds (cos, sin) pairs
    cs = cs_ptr + tl.load(pos_ptr + n) * D + offs * 2
    cos = tl.load(cs, mask=dmask, other=0.0)[None, :]
    sin = tl.load(cs + 1, mask=dmask, other=0.0)[None, :]

    heads = tl.arange(0, H_BLOCK)[:, None]
    m = (heads < H) & dmask[None, :]
    cols = heads * D + offs[None, :]
    x1 = tl.load(row + cols, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(row + half + cols, mask=m, other=0.0).to(tl.float32)
    o1, o2 = _norm_rope(x1, x2, qw_ptr, offs, dmask, cos, sin, D, eps, dtype)
    q = q_ptr + n * q_stride_n + heads * q_stride_h + offs[None, :]
    tl.store(q, o1, mask=m)
    tl.store(q + half, o2, mask=m)

    # Slot -1 marks a padding row of a CUDA-graph bucket: compute, store nothing.
    slot = tl.load(slot_ptr + n)
    kheads = tl.arange(0, KH_BLOCK)[:, None]
    km = (kheads < KH) & dmask[None, :]
    keep = km & (slot >= 0)
    slot = tl.maximum(slot, 0)
    kcols = (H + kheads) * D + offs[None, :]
    x1 = tl.load(row + kcols, mask=km, other=0.0).to(tl.float32)
    x2 = tl.load(row + half + kcols, mask=km, other=0.0).to(tl.float32)
    o1, o2 = _norm_rope(x1, x2, kw_ptr, offs, dmask, cos, sin, D, eps, dtype)
    k = kv_ptr + (slot // block_size) * kv_s0 + layer * kv_s1 + kheads * kv_s3 + (slot % block_size) * kv_s4 + offs[None, :]
    tl.store(k, o1.to(dtype), mask=keep)  # round to model dtype as the reference's RoPE output
    tl.store(k + half, o2.to(dtype), mask=keep)
    v_src = row + KH * D + kcols  # v head kh sits KH heads after k head kh
    v = k + kv_s2
    tl.store(v, tl.load(v_src, mask=km, other=0.0), mask=keep)
    tl.store(v + half, tl.load(v_src + half, mask=km, other=0.0), mask=keep)


def qk_norm_rope_store(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, eps: float,
                       positions: torch.Tensor, cos_sin: torch.Tensor, kv_cache: torch.Tensor, layer: int,
                       slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                       q_out: torch.Tensor | None = None) -> torch.Tensor:
    """qkv [N, (H + 2·KH)·D] (q, k, v columns) → q_out [N, H, D] = rope(rmsnorm(q)); k = rope(rmsnorm(k)) and v
    are written to kv_cache [num_blocks, num_layers, 2, KH, block_size, D] at [slot // bs, layer, 0|1, :,
    slot % bs] with slot = slot_mapping[n] (int64 [N]; -1 = store nothing).

    positions int64 [N] index cos_sin = rope_cache(D, max_position, ...), so every row (padding rows too) must
    hold a position < max_position. q/k norm weights [D].
    """
    n = qkv.shape[0]
    h, kh, d = num_heads, num_kv_heads, head_dim
    assert qkv.dim() == 2 and qkv.shape[1] == (h + 2 * kh) * d and qkv.stride(-1) == 1
    assert kv_cache.dim() == 6 and kv_cache.shape[2:4] == (2, kh) and kv_cache.shape[5] == d
    assert kv_cache.stride(-1) == 1 and cos_sin.is_contiguous() and cos_sin.shape[1:] == (d // 2, 2)
    assert q_norm_weight.is_contiguous() and k_norm_weight.is_contiguous() and d % 2 == 0
    assert positions.shape == (n,) and slot_mapping.shape == (n,) and slot_mapping.dtype == torch.int64
    if q_out is None:
        q_out = torch.empty(n, h, d, dtype=qkv.dtype, device=qkv.device)
    assert q_out.shape == (n, h, d) and q_out.stride(-1) == 1
    if n > 0:
        half_block, h_block = triton.next_power_of_2(d // 2), triton.next_power_of_2(h)
        _qk_norm_rope_store_kernel[(n,)](
            qkv, q_norm_weight, k_norm_weight, positions, cos_sin, kv_cache, slot_mapping, q_out,
            qkv.stride(0), q_out.stride(0), q_out.stride(1), *kv_cache.stride()[:5],
            layer, kv_cache.shape[4], eps, H=h, KH=kh, D=d, HALF_BLOCK=half_block, H_BLOCK=h_block,
            KH_BLOCK=triton.next_power_of_2(kh), num_warps=max(1, min(8, h_block * half_block // 256)),
            PDL=(pdl := launch.pdl(qkv)), launch_pdl=pdl)
    return q_out


# ---------------------------------------------------------------------------------------------------------------
# SiLU-gated MLP activation


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, gu_stride, out_stride, inter, BLOCK: tl.constexpr, PDL: tl.constexpr):
    inputs_ready(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    g = tl.load(gu_ptr + row * gu_stride + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * gu_stride + inter + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + offs, g / (1.0 + tl.exp(-g)) * u, mask=mask)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gate_up [N, 2·I] (gate columns, then up) → out [N, I] = silu(gate) · up in fp32, one rounding."""
    assert gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0 and gate_up.stride(-1) == 1
    n, inter = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty(n, inter, dtype=gate_up.dtype, device=gate_up.device)
    assert out.shape == (n, inter) and out.stride(-1) == 1
    if n > 0:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_mul_kernel[(n, triton.cdiv(inter, block))](gate_up, out, gate_up.stride(0), out.stride(0), inter,
                                                          BLOCK=block, num_warps=_warps(block),
                                                          PDL=(pdl := launch.pdl(gate_up)), launch_pdl=pdl)
    return out
