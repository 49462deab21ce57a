"""Paged attention over the shared KV pool: a split-K decode kernel and a varlen causal prefill kernel.

The pool is TensorRT-LLM's layout (docs/architecture.md §3), read in place, never gathered:
    kv_cache [num_blocks, num_layers, 2, kv_heads, block_size, head_dim]   (2: K then V)
Position p of a sequence lives in block block_table[p // block_size] at offset p % block_size.

Both kernels are flash attention: scores for a tile of keys, an online softmax (running max m, running
sum l, unnormalised output acc, all float32) and tl.dot for both products. Scores are kept in log2 units
(scale * log2(e)) so the kernels can use exp2. GQA: a program owns one KV head and computes every query
head of its group together, so each K/V tile is loaded once per group, not once per query head.

Decode (one query per sequence) is "flash-decoding": each sequence's context is cut into at most SLICES slices of
equal length (whole key tiles), one program per (slice, kv head, sequence), and a small second kernel merges the
partial (m, l, acc) of a group's slices; with one slice the first kernel writes the output itself and the merge is
not launched. SLICES depends only on the batch size (`decode_slices`: about TARGET_PROGRAMS programs), and each
slice's length on its sequence's context, so a call can be captured in a CUDA graph and replayed with new lengths.
Why not fixed-length slices over the longest context a graph allows: at the stack's contexts (~256-512) nearly all
of those programs had nothing to do, and under MPS at 25% of an H100 the 8,192 programs of a batch of 32 made the
attention 3.7x its KV traffic (docs/benchmarks.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.common import launch
from services.common.launch import inputs_ready

# Decode programs to aim for: about two per SM of an H100 (132). A sequence's context is cut into at most
# MAX_SLICES slices, each at least one key tile long: batch 1 at context 2048 → 32 slices x 8 kv heads.
TARGET_PROGRAMS = 256
MAX_SLICES = 32
INTERPRETER_SLICES = 2
# Packed calls of at most this many rows (mixed steps: decode rows and a turn's few new positions) take small
# prefill tiles (`prefill_block_m`).
SMALL_PACKED_ROWS = 128
LOG2E = 1.4426950408889634


def decode_slices(batch: int, kv_heads: int) -> int:
    """Slices per sequence for a decode call of `batch` sequences: enough programs to fill the GPU, no more."""
    return max(1, min(MAX_SLICES, -(-TARGET_PROGRAMS // (batch * kv_heads))))


@triton.jit
def _kv_offsets(table_ptr, pos, valid, stride_block, stride_token,
                BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Element offsets [BLOCK_N, HEAD_DIM] of positions `pos` [BLOCK_N] inside one (layer, K, kv head)
    plane of the pool; V is the same offsets plus the K/V stride. int64: the pool exceeds 2**31 elements."""
    block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    row = block * stride_block + (pos % BLOCK_SIZE).to(tl.int64) * stride_token
    return row[:, None] + tl.arange(0, HEAD_DIM)[None, :]


@triton.jit
def _attend_tile(q, k, v, mask, m, l, acc, qk_scale):
    """One online-softmax step. q [M, D]; k, v [N, D]; mask [M, N] or [1, N]; m, l [M]; acc [M, D] float32.
    Callers guarantee every row sees a valid key in its first tile, so m is finite from then on (no NaN).
    "ieee" keeps float32 exact (no tf32); 16-bit inputs use tensor cores regardless."""
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m - m_new)  # rescales what was accumulated under the old max (0 on the first tile)
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l, acc


@triton.jit
def _slice_length(ctx, SLICES: tl.constexpr, BLOCK_N: tl.constexpr):
    """Positions per slice of a context of `ctx` (a multiple of BLOCK_N, >= 1): at most SLICES slices, each at
    least one key tile. Slices 0 .. cdiv(ctx, length) - 1 hold positions; the others none."""
    slices = tl.maximum(tl.minimum(tl.cdiv(ctx, BLOCK_N), SLICES), 1)
    return tl.maximum(tl.cdiv(tl.cdiv(ctx, slices), BLOCK_N) * BLOCK_N, 1)


@triton.jit
def _decode_partition_kernel(
    q_ptr, kv_ptr, table_ptr, ctx_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    layer, qk_scale,
    stride_qb, stride_qh, stride_ob, stride_oh,
    stride_kv_block, stride_kv_layer, stride_kv_kv, stride_kv_head, stride_kv_token, stride_table,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    SLICES: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """Grid (SLICES, kv_heads, B): slice `part` of sequence b's context for the GROUP query heads of one KV head
    → partial m, l [B, H, SLICES] and acc [B, H, SLICES, D]; with SLICES 1, out [B, H, D] itself (ctx 0: zeros)."""
    inputs_ready(PDL)
    part, kv_head, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ctx = tl.load(ctx_ptr + b)
    length = _slice_length(ctx, SLICES, BLOCK_N)
    start = part * length
    if SLICES > 1:
        if start >= ctx:  # past this sequence's context, or a padding row (ctx 0): nothing to add
            return
    end = tl.minimum(start + length, ctx)

    # The group's query heads as the rows of a tl.dot tile, padded to GROUP_PAD >= 16 rows (zeros).
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    live = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=live[:, None], other=0.0)  # [GROUP_PAD, D]

    k_plane = kv_ptr + layer * stride_kv_layer + kv_head * stride_kv_head
    table = table_ptr + b * stride_table
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for n in range(start, end, BLOCK_N):
        pos = n + tl.arange(0, BLOCK_N)
        valid = pos < end
        offs = _kv_offsets(table, pos, valid, stride_kv_block, stride_kv_token, BLOCK_SIZE, HEAD_DIM)
        k = tl.load(k_plane + offs, mask=valid[:, None], other=0.0)  # [BLOCK_N, D]
        v = tl.load(k_plane + stride_kv_kv + offs, mask=valid[:, None], other=0.0)
        m, l, acc = _attend_tile(q, k, v, valid[None, :], m, l, acc, qk_scale)

    if SLICES == 1:  # the whole context: normalise and write the output (a padding row: l 0, acc 0 → zeros)
        out = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=live[:, None])
    else:
        row = (b * tl.num_programs(1) * GROUP + heads) * SLICES + part  # [GROUP_PAD] into [B, H, SLICES]
        tl.store(part_m_ptr + row, m, mask=live)
        tl.store(part_l_ptr + row, l, mask=live)
        tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=live[:, None])


@triton.jit
def _decode_merge_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, ctx_ptr, out_ptr,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, SLICES: tl.constexpr,
    BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """Grid (kv_heads, B): merge the slices the first kernel wrote for one sequence's GROUP query heads of a KV head:
    out = sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p - M) l_p with M = max_p m_p; a ctx-0 row gets zeros."""
    inputs_ready(PDL)
    kv_head, b = tl.program_id(0), tl.program_id(1)
    ctx = tl.load(ctx_ptr + b)
    n_parts = tl.cdiv(ctx, _slice_length(ctx, SLICES, BLOCK_N))  # slices written for this row; only these are read
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    live = g < GROUP
    heads = kv_head * GROUP + g
    row = (b * tl.num_programs(0) * GROUP + heads) * SLICES  # [GROUP_PAD]: slice 0 of each head

    m_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    for p in range(0, n_parts):
        m_max = tl.maximum(m_max, tl.load(part_m_ptr + row + p, mask=live, other=0.0))
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for p in range(0, n_parts):
        w = tl.exp2(tl.load(part_m_ptr + row + p, mask=live, other=0.0) - m_max)
        total += w * tl.load(part_l_ptr + row + p, mask=live, other=0.0)
        acc += w[:, None] * tl.load(part_acc_ptr + (row + p)[:, None] * HEAD_DIM + d[None, :], mask=live[:, None],
                                    other=0.0)
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=live[:, None])


@triton.jit
def _prefill_kernel(
    q_ptr, kv_ptr, table_ptr, cu_q_ptr, ctx_ptr, out_ptr,
    layer, qk_scale, num_seqs,
    stride_qn, stride_qh, stride_on, stride_oh,
    stride_kv_block, stride_kv_layer, stride_kv_kv, stride_kv_head, stride_kv_token, stride_table,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """Grid (num_rows // POSITIONS + num_seqs, kv_heads), POSITIONS = BLOCK_M // GROUP, num_seqs = min(S, num_rows)
    (the sequences that can have rows: padding ones after them are never searched). A tile's BLOCK_M rows are
    POSITIONS query positions x the GROUP heads of one KV head (row r: position r // GROUP, head r % GROUP),
    so each K/V tile is loaded once per group and a q_len-1 row still fills GROUP rows of the tile.

    Tiles are numbered across sequences: sequence s owns tiles from first(s) = cu_q[s] // POSITIONS + s,
    which leaves it at least cdiv(q_len_s, POSITIONS) of them, so the grid depends only on the number of
    rows and sequences, never on how the rows split (a graph captured once serves every split); a
    program finds its sequence by binary search over first(s) and returns if its tile has no rows."""
    inputs_ready(PDL)
    pid, kv_head = tl.program_id(0), tl.program_id(1)
    POSITIONS: tl.constexpr = BLOCK_M // GROUP
    lo = pid * 0  # int32 scalars (num_seqs 1 is specialised to a constant)
    hi = lo + num_seqs - 1
    while lo < hi:  # the last sequence whose first tile is <= pid
        mid = (lo + hi + 1) // 2
        before = tl.load(cu_q_ptr + mid) // POSITIONS + mid <= pid
        lo = tl.where(before, mid, lo)
        hi = tl.where(before, hi, mid - 1)
    seq = lo
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    tile = pid - (q_start // POSITIONS + seq)
    if tile * POSITIONS >= q_len:  # a tile beyond this sequence's rows (or a padding sequence, q_len 0)
        return
    ctx = tl.load(ctx_ptr + seq)

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_DIM)
    q_idx = tile * POSITIONS + r // GROUP  # [BLOCK_M] index among the sequence's new rows
    heads = kv_head * GROUP + r % GROUP
    row_ok = (r < POSITIONS * GROUP) & (q_idx < q_len)
    q_pos = ctx - q_len + q_idx  # absolute position: attends to keys 0..q_pos (key 0 always, so no NaN)
    q = tl.load(q_ptr + (q_start + q_idx)[:, None] * stride_qn + heads[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None], other=0.0)  # [BLOCK_M, D]

    k_plane = kv_ptr + layer * stride_kv_layer + kv_head * stride_kv_head
    table = table_ptr + seq * stride_table
    kv_end = tl.minimum(ctx, ctx - q_len + (tile + 1) * POSITIONS)  # one past the tile's last position
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n in range(0, kv_end, BLOCK_N):
        pos = n + tl.arange(0, BLOCK_N)
        valid = pos < kv_end
        offs = _kv_offsets(table, pos, valid, stride_kv_block, stride_kv_token, BLOCK_SIZE, HEAD_DIM)
        k = tl.load(k_plane + offs, mask=valid[:, None], other=0.0)  # [BLOCK_N, D]
        v = tl.load(k_plane + stride_kv_kv + offs, mask=valid[:, None], other=0.0)
        causal = valid[None, :] & (pos[None, :] <= q_pos[:, None])  # [BLOCK_M, BLOCK_N]
        m, l, acc = _attend_tile(q, k, v, causal, m, l, acc, qk_scale)

    out = acc / l[:, None]
    tl.store(out_ptr + (q_start + q_idx)[:, None] * stride_on + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def _check(q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor | None) -> tuple[int, int]:
    """Check q, the pool and a given out against each other; → (kv_heads, block_size)."""
    _, _, two, kv_heads, block_size, head_dim = kv_cache.shape
    heads = q.shape[1]
    assert kv_cache.is_contiguous() and two == 2, "kv_cache must be a contiguous [blocks, layers, 2, KH, bs, D] pool"
    assert q.shape[2] == head_dim and q.stride(2) == 1 and q.dtype == kv_cache.dtype
    assert heads % kv_heads == 0, "query heads must be a multiple of kv heads"
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, "head_dim must be a power of two >= 16"
    assert block_size >= 16 and block_size & (block_size - 1) == 0, "block_size must be a power of two >= 16"
    assert out is None or (out.shape == q.shape and out.dtype == q.dtype and out.stride(2) == 1)
    return kv_heads, block_size


def _tiles(q: torch.Tensor) -> tuple[int, int, int]:
    """→ (decode BLOCK_N, prefill BLOCK_M, prefill BLOCK_N), checked with ptxas for sm_90 (no spills at
    head_dim 128): 16-bit dots run on tensor cores with 64-wide tiles; float32 "ieee" dots run on FMA units
    and hold more per thread, so above head_dim 32 they take smaller tiles."""
    if q.element_size() == 2 or q.shape[2] <= 32:
        return 64, 64, 64
    return 32, 32, 16


def paged_decode_attention(q, kv_cache, layer, block_tables, context_lens, scale, out=None, slices=None,
                           tiles: dict | None = None):
    """One query per sequence over its paged context. CUDA-graph safe: no host sync, and the grid depends
    only on B and the shapes.

    q [B, H, D]; block_tables [B, max_blocks] int32; context_lens [B] int32 (0: padding row → zeros);
    slices: a sequence's context is cut into at most this many (default `decode_slices`; tests force others);
    tiles: the first kernel's BLOCK_N, num_warps, num_stages (bench/studies/llm_attention.py compares)
    → out [B, H, D] in q's dtype.
    """
    batch, heads, head_dim = q.shape
    kv_heads, block_size = _check(q, kv_cache, out)
    group = heads // kv_heads
    if out is None:
        out = torch.empty((batch, heads, head_dim), dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    # (Triton's interpreter on a CPU runs every program in Python, even one with nothing to do, and captures no graphs:
    # two slices there, so that the merge still runs.)
    slices = slices or (decode_slices(batch, kv_heads) if q.is_cuda else INTERPRETER_SLICES)
    # Partials in float32 (one slice: unused); slices a row does not reach are left unwritten and never read.
    part_m = torch.empty((batch, heads, slices), dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((*part_m.shape, head_dim), dtype=torch.float32, device=q.device)
    block_n, _, _ = _tiles(q)
    tiles = {"BLOCK_N": block_n, "num_warps": 4, "num_stages": 3, **(tiles or {})}  # (3: bench/studies/llm_attention.py)
    group_pad = max(16, triton.next_power_of_2(group))
    pdl = launch.pdl(q)
    s = kv_cache.stride()
    _decode_partition_kernel[(slices, kv_heads, batch)](
        q, kv_cache, block_tables, context_lens, part_m, part_l, part_acc, out,
        layer, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        s[0], s[1], s[2], s[3], s[4], block_tables.stride(0),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, SLICES=slices, **tiles, PDL=pdl, launch_pdl=pdl,
    )
    if slices > 1:
        _decode_merge_kernel[(kv_heads, batch)](
            part_m, part_l, part_acc, context_lens, out, out.stride(0), out.stride(1),
            GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, SLICES=slices, BLOCK_N=tiles["BLOCK_N"], num_warps=4,
            PDL=pdl, launch_pdl=pdl,
        )
    return out


def prefill_block_m(rows: int, group: int, block_m: int) -> int:
    """A prefill tile's query rows for a packed call of `rows` rows. A q_len-1 row (a decode row riding along in
    a mixed step) fills only GROUP rows of its tile, so a small packed step, mostly such rows, takes the smallest
    tile that holds a whole group (16 rows: 4 positions at group 4); larger ones keep `block_m`."""
    return max(16, triton.next_power_of_2(group)) if rows <= SMALL_PACKED_ROWS else block_m


def paged_prefill_attention(q, kv_cache, layer, block_tables, cu_seqlens_q, context_lens, scale, out=None,
                            tiles: dict | None = None):
    """Causal attention of packed new rows over their sequences' paged contexts (prefix hits, chunked
    prefill and q_len-1 decode rows alike). CUDA-graph safe: the grid depends only on N and S; padding
    sequences (q_len 0, only after every sequence with rows) and rows after cu_seqlens_q[S] are left alone (those
    rows of out unwritten).

    q [N, H, D]: the new rows of S sequences back to back; cu_seqlens_q [S+1] int32; context_lens [S] int32
    (positions after this step: sequence s's rows sit at context_lens[s] - q_len_s .. context_lens[s] - 1,
    their K/V already in the pool); block_tables [S, max_blocks] int32;
    tiles: BLOCK_M, BLOCK_N (bench/studies/llm_attention.py compares; default `prefill_block_m` and `_tiles`)
    → out [N, H, D] in q's dtype.
    """
    rows, heads, head_dim = q.shape
    kv_heads, block_size = _check(q, kv_cache, out)
    group = heads // kv_heads
    if out is None:
        out = torch.empty((rows, heads, head_dim), dtype=q.dtype, device=q.device)
    # Every sequence with rows has at least one, so at most N of the S have any: the grid and the kernel's search
    # need only the first min(S, N). (A graph's S is max_num_seqs, 256, against 16-64 rows in a mixed step: the
    # other sequences' programs, each a search and a return, were most of the call under MPS at 25%.)
    num_seqs = min(context_lens.shape[0], rows)
    if num_seqs == 0:
        return out
    _, block_m, block_n = _tiles(q)
    tiles = {"BLOCK_M": prefill_block_m(rows, group, block_m), "BLOCK_N": block_n, **(tiles or {})}
    assert group <= tiles["BLOCK_M"], "a tile holds at least one position's whole group"
    s = kv_cache.stride()
    grid = (rows // (tiles["BLOCK_M"] // group) + num_seqs, kv_heads)
    _prefill_kernel[grid](
        q, kv_cache, block_tables, cu_seqlens_q, context_lens, out,
        layer, scale * LOG2E, num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        s[0], s[1], s[2], s[3], s[4], block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, **tiles,
        num_warps=4, num_stages=2, PDL=(pdl := launch.pdl(q)), launch_pdl=pdl,
    )
    return out
