"""The encoder's causal attention for many streams in one call, over a pool of per-stream keys and values.

Each stream (a speaker's segment) owns a slot of the pool: keys and values [slots, heads, max_source_positions, d]
per layer, its frames at their positions. A call's new frames are packed as rows [N, heads, d], stream i's `t_i`
rows from `row_i` on, after the `past_i` frames its slot already holds; their keys and values are written to the
slot first (`write`), then each row reads its slot's keys up to its own position (`attend`).

On CUDA a Triton kernel does every stream's rows in one launch: a program per (block of a stream's rows, head),
looping over the slot's keys; elsewhere the PyTorch form runs stream by stream (the tests hold the kernel to it in
Triton's interpreter).

Shapes: q [N, heads, d]; k, v [slots, heads, frames, d]; Layout's slot, row, count, past [streams] (int32) →
[N, heads, d].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (CI installs triton; the PyTorch form needs none)
    triton = None

BLOCK_M = 32  # a program's rows (one stream's)
BLOCK_N = 64  # keys a step of its loop


@dataclass
class Layout:
    """Where a call's streams are: on the host (lists) and, for the kernel, on the device."""

    slots: list[int]
    rows: list[int]      # each stream's first packed row
    counts: list[int]    # its new rows
    past: list[int]      # frames its slot held before this call
    device: torch.device

    def __post_init__(self):
        self.positions = torch.cat([torch.arange(p, p + t) for p, t in zip(self.past, self.counts)]).to(self.device)
        self.row_slots = torch.cat([torch.full((t,), s) for s, t in zip(self.slots, self.counts)]).to(self.device)
        # the kernel's programs: (stream, first row of the block) for every block of BLOCK_M of a stream's rows
        blocks = [(i, start) for i, t in enumerate(self.counts) for start in range(0, t, BLOCK_M)]
        self.blocks = torch.tensor(blocks or [(0, 0)], dtype=torch.int32).to(self.device)
        self.num_blocks = len(blocks)
        self.meta = torch.tensor([self.slots, self.rows, self.counts, self.past], dtype=torch.int32).to(self.device)


def write(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> None:
    """The new rows' keys and values [N, heads, d] into their slots at their positions."""
    k_pool[layout.row_slots, :, layout.positions] = k
    v_pool[layout.row_slots, :, layout.positions] = v


def attend(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, layout: Layout) -> torch.Tensor:
    if q.is_cuda and triton is not None:
        return kernel(q, k_pool, v_pool, layout)
    return reference(q, k_pool, v_pool, layout)


def reference(q, k_pool, v_pool, layout: Layout) -> torch.Tensor:
    """PyTorch, stream by stream: scaled_dot_product_attention with the causal mask offset by the frames before."""
    out = torch.empty_like(q)
    for slot, row, t, past in zip(layout.slots, layout.rows, layout.counts, layout.past):
        if not t:
            continue
        qi = q[row : row + t].transpose(0, 1)                                        # [heads, t, d]
        ki, vi = k_pool[slot, :, : past + t], v_pool[slot, :, : past + t]            # [heads, past + t, d]
        allowed = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(past)
        out[row : row + t] = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=allowed).transpose(0, 1)
    return out


def kernel(q, k_pool, v_pool, layout: Layout) -> torch.Tensor:
    """The Triton kernel (on CPU tensors: Triton's interpreter, for the tests)."""
    N, H, d = q.shape
    out = torch.empty_like(q)
    if layout.num_blocks == 0:
        return out
    n = layout.meta.shape[1]  # (a graph's layout has room for more streams than it holds: graphs.py)
    _causal_pool_attention[(layout.num_blocks, H)](
        q, k_pool, v_pool, out, layout.blocks, layout.meta, n, *q.stride()[:2], *k_pool.stride()[:3],
        *v_pool.stride()[:3], *out.stride()[:2], 1.0 / math.sqrt(d), D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    return out


if triton is not None:
    @triton.jit
    def _causal_pool_attention(Q, K, V, OUT, BLOCKS, META, n, sq_n, sq_h, sk_s, sk_h, sk_t, sv_s, sv_h, sv_t,
                               so_n, so_h, scale, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               PRECISION: tl.constexpr):
        pid, h = tl.program_id(0), tl.program_id(1)
        stream, first = tl.load(BLOCKS + 2 * pid), tl.load(BLOCKS + 2 * pid + 1)
        slot, row = tl.load(META + stream), tl.load(META + n + stream)
        count, past = tl.load(META + 2 * n + stream), tl.load(META + 3 * n + stream)
        offs_m = first + tl.arange(0, BLOCK_M)                     # the block's rows, within the stream's
        offs_d = tl.arange(0, D)
        row_ok = offs_m < count
        q = tl.load(Q + (row + offs_m[:, None]) * sq_n + h * sq_h + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        position = past + offs_m                                   # a row reads keys 0 .. its position
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        K0, V0 = K + slot * sk_s + h * sk_h, V + slot * sv_s + h * sv_h
        hi = past + tl.minimum(first + BLOCK_M, count)             # keys any row of the block reads
        for start in range(0, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            key_ok = offs_n < hi
            kt = tl.load(K0 + offs_n[None, :] * sk_t + offs_d[:, None], mask=key_ok[None, :], other=0.0)
            allowed = (offs_n[None, :] <= position[:, None]) & key_ok[None, :]
            s = tl.where(allowed, tl.dot(q, kt, input_precision=PRECISION) * scale, -1.0e30)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.where(allowed, tl.exp(s - m_new[:, None]), 0.0)
            alpha = tl.exp(m_i - m_new)
            v = tl.load(V0 + offs_n[:, None] * sv_t + offs_d[None, :], mask=key_ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(OUT + (row + offs_m[:, None]) * so_n + h * so_h + offs_d[None, :], out.to(OUT.dtype.element_ty),
                 mask=row_ok[:, None])
