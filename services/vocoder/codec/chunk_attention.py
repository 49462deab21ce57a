"""The estimator's attention: static-chunk causal, over a row's valid frames, after a voice's prompt prefix.

A query at frame i of a row with `length` valid frames reads the keys j < min(length, the end of i's chunk)
(chunk 0: j < length), and, with a prompt prefix (prefix.py), every key of the prefix before them: those
frames are whole chunks before the row's first. In PyTorch that is an additive mask over [T, T] per row and
the prefix's keys and values gathered and concatenated before the row's, for each of the 56 attentions and
10 Euler steps of a flow call; on an H100 the masked attention and the concatenation took 40% of a saturated
call (docs/benchmarks.md). On CUDA a Triton kernel does it in one pass instead: the chunk rule and
the lengths in the kernel, the prefix read where it lies (its voice's rows of the cache), the output written
in the [B, T, heads·d] layout the output projection reads. Elsewhere (CPU) the PyTorch form runs.

With a stream's history (history.py) a row's frames are a stream's newest: before them it reads the prefix, then
the frames the stream solved in its earlier calls (a ring of their keys and values: attention has no positions,
so their order there does not matter). The row's own newest keys and values go into that ring after the attention
has read it, by the next per-frame kernel (frame_ops.frame_norm's `keep`): written here, a query block would
overwrite what another is still to read.

A call of a few streams has few programs (a query block of a row and head each: 32 for one stream), and each walks
~10 blocks of keys one after another: the prefix's, the ring's, the row's own. There the keys are read in parts side
by side (the prefix in two spans, the ring, the row's own: 4 programs where there was one), each part's running max,
sum and output kept in float32, and a second kernel combines them as one walk would have (flash-decoding's split).
On an H100 that is 12-13% faster at 1-3 streams' steady calls, no faster for a first call (40 frames: a few blocks
of 64 keys), and 18% slower at 6 streams, whose programs already fill the GPU (tiles(); docs/benchmarks.md).

A call of many streams has every (query block, row, head) program read its voice's whole prefix again, though the
rows of one voice and CFG half read the same keys. CASCADE reads it once per voice instead (cascade inference): a
first kernel (`_prefix_part`) takes 64 queries of consecutive rows at a time against their prefix row (at most two,
for rows of 64 frames or more), keeps each query's running max, sum and output in float32, and the kernel above reads
the ring and the row's own keys, then merges. Measured on an H200, it is off (CASCADE_FROM = 0): a steady call of 32
streams took 68.2 ms against 63.3 without it, 16 streams 45.6 against 45.3 (docs/benchmarks.md). The float32 part
written and read again is ~21 MB an attention at 32 streams, more than the prefix reads it saves.

A program's three walks (the prefix's, the ring's, the row's own keys) are three loops, each software-pipelined
apart. One loop over the three sources' blocks laid end to end was measured on an H200 and not kept: at 32 streams'
steady calls 39.4 us an attention against 25.7 (a steady call 80.9 ms against 61-68), slower at every shape and tile
(docs/benchmarks.md, 2026-12-02). That fits a kernel bound by its instructions, not its loads: compiled for sm_90, a
16 x 16 step of one warp is ~270 instructions, 16 of them tensor-core products, and Nsight Compute finds its
one-warp programs all resident (0.97 waves) but each issuing once in ~7 cycles. The small tiles therefore keep their
running max lazily (LAZY): the scores in base 2 with the scale folded into one multiply (exp2), the running output and
sum rescaled only when a block's max passes the kept one by 2^8 (a branch the whole warp takes together;
FlashAttention-4's conditional rescaling), and the values' product accumulating into the output in the tensor cores.
The same sums up to float32 rounding: the output is the same ratio of sums whatever max they were taken against. Left
to itself the compiler gives that step 98 registers a thread (~210 instructions a step, 18% fewer executed), and at
98 a scheduler holds 4 one-warp programs, not 5: 32 streams' 2,560 programs took a second wave (31.2 us against
25.7). Held to the 96 of the step that rescales every block (maxnreg), it is ~225 instructions a step, and on an
H200 24.2 us against 25.7 at 32 streams, 15.2 against 17.0 at 16, 10.2 against 12.9 at 6 (docs/benchmarks.md,
2026-12-02): so calls from 6 streams take the small tile.

Shapes: q, k, v [B, heads, T, d] (any strides, d contiguous); lengths [B] int; prefix keys and values
[R, heads, F, d] with rows [B] (each row's in R); history: ring keys and values [S, heads, ring, d], rows [B]
(each row's in S) and count [B] (its frames there, the first `count` places) → [B, T, heads·d].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (CI installs triton; the PyTorch form needs none)
    triton = None
else:
    from services.common.launch import inputs_ready

from services.common import launch

MASKED = -1.0e10  # the reference's additive attention bias for a key a query may not read
SPLIT = True       # few programs: each (query block, row, head) reads its keys as parts side by side, then a combine
PREFIX_PARTS = 2   # the prompt prefix's keys in this many parts (then the ring, then the row's own: 4 parts)
SPLIT_BELOW = 128  # programs; measured on an H100: parts 12-13% faster at 1-3 streams (≤ 96), 18% slower at 6 (192)
SMALL_TILES_FROM = 96   # rows x heads (6 streams) from which a call with a history takes SMALL_TILE (0: never)
CASCADE_FROM = 0        # rows x heads from which a call with a history reads the prompt prefix once per voice (0:
                        # never: measured slower at 16 and 32 streams, module docstring)
CASCADE_TILE = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4)  # the prefix part's: many rows' queries against one prefix
# 16 queries by 16 keys with one warp, the max kept lazily, at most 96 registers a thread (ptxas's .maxnreg; module
# docstring). LAZY takes PARTS 1 and no CASCADE: a call that reads the prefix once per voice rescales every block.
SMALL_TILE = dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, LAZY=True, maxnreg=96)
LOG2E = 1.4426950408889634


def attention_bias(lengths: torch.Tensor, T: int, chunk: int, dtype: torch.dtype, prefix_frames: int = 0):
    """The additive bias [B, 1, T, prefix_frames + T] of a query (row) reading a key (column)."""
    pos = torch.arange(T, device=lengths.device)
    allowed = (pos[None, None, :] < lengths[:, None, None]).expand(-1, T, -1)          # [B, T(query), T(key)]
    if chunk > 0:
        allowed = allowed & (pos[None, :] < ((pos // chunk + 1) * chunk)[:, None])[None]
    return F.pad((~allowed).to(dtype) * MASKED, (prefix_frames, 0))[:, None]


def reference(q, k, v, lengths, chunk, prefix=None, history=None):
    """PyTorch: the mask as a bias, the prefix and the history gathered and concatenated,
    scaled_dot_product_attention."""
    B, H, T, d = q.shape
    keys, values, bias = [k], [v], attention_bias(lengths, T, chunk, q.dtype)
    if history is not None:
        hk, hv, rows, count = history
        keys.insert(0, hk.index_select(0, rows))
        values.insert(0, hv.index_select(0, rows))
        unread = torch.arange(hk.shape[2], device=q.device)[None, :] >= count[:, None]           # [B, ring]
        bias = torch.cat([(unread.to(q.dtype) * MASKED)[:, None, None, :].expand(-1, 1, T, -1), bias], -1)
    if prefix is not None:
        pk, pv, rows = prefix
        keys.insert(0, pk.index_select(0, rows))
        values.insert(0, pv.index_select(0, rows))
        bias = F.pad(bias, (pk.shape[2], 0))
    out = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2), attn_mask=bias)
    return out.transpose(1, 2).reshape(B, T, H * d)


def chunk_attention(q, k, v, lengths, chunk: int, prefix=None, history=None):
    """→ [B, T, heads·d]: the Triton kernel on CUDA, the PyTorch form elsewhere (module docstring)."""
    if not q.is_cuda or triton is None:
        return reference(q, k, v, lengths, chunk, prefix, history)
    return kernel(q, k, v, lengths, chunk, prefix, history=history)


def tiles(B: int, H: int, T: int, before: int = 0, history: bool = False) -> dict:
    """Queries and keys per step of the kernel (before: prefix and kept frames every query reads). Measured on an
    H100 (bench/studies/codec_kernels.py, docs/benchmarks.md): 64 queries by 32 keys for a saturated call (29.3 us against
    30.8 with 64 by 64); for a first block alone, whose few programs leave most of the GPU idle, 32 by 64 (5.7
    against 7.2 us). A few queries after many keys (a stream history's first call): 16 by 64. With a history, from
    SMALL_TILES_FROM rows x heads (6 streams), SMALL_TILE (an H200: 24.2 against 25.7 us at 32 streams, 10.2
    against 12.9 at 6; at 3 slower than parts: module docstring). PARTS: the keys in 4 parts (module docstring)
    for a steady call below SPLIT_BELOW programs with 64 or more keys before the row's own, else 1."""
    if T < 64:  # (a first call's few blocks of 64 keys: in parts no faster, measured)
        return dict(BLOCK_M=16, BLOCK_N=64 if before >= 64 else 16, PARTS=1)
    cascade = history and bool(CASCADE_FROM) and B * H >= CASCADE_FROM and T >= CASCADE_TILE["BLOCK_M"]
    if history and SMALL_TILES_FROM and B * H >= SMALL_TILES_FROM:
        return dict(SMALL_TILE, PARTS=1, CASCADE=cascade, LAZY=SMALL_TILE["LAZY"] and not cascade)
    config = dict(BLOCK_M=32, BLOCK_N=64) if B * H <= 32 else dict(BLOCK_M=64, BLOCK_N=32)
    few = -(-T // config["BLOCK_M"]) * B * H < SPLIT_BELOW
    parts = PREFIX_PARTS + 2 if SPLIT and few and before >= 64 else 1
    return dict(config, PARTS=parts, CASCADE=cascade and parts == 1)


def kernel(q, k, v, lengths, chunk: int, prefix=None, config: dict | None = None, history=None):
    """The Triton kernel (on CPU tensors: Triton's interpreter, for the tests). config: BLOCK_M, BLOCK_N and
    launch options (bench/studies/codec_kernels.py times them)."""
    B, H, T, d = q.shape
    out = torch.empty(B, T, H, d, device=q.device, dtype=q.dtype)
    if prefix is None:
        pk = pv = k  # unread: no prefix frames
        rows, frames = lengths, 0
    else:
        pk, pv, rows = prefix
        frames = pk.shape[2]
    hk, hv, hrows, count = history if history is not None else (pk, pv, rows, lengths)  # unread without one
    config = dict(config or tiles(B, H, T, frames + (hk.shape[2] if history is not None else 0), history is not None))
    parts = config.pop("PARTS", 1)
    cascade = config.pop("CASCADE", False) and frames > 0
    lazy = config.pop("LAZY", False)
    if not q.is_cuda:
        config.pop("maxnreg", None)  # (a compiler's option: Triton's interpreter takes none)
    if lazy and (parts != 1 or cascade):
        raise ValueError("chunk attention: the max kept lazily (LAZY) takes PARTS 1 and no CASCADE (their parts are "
                         "combined in natural units)")
    if parts == 2 or parts < 1:
        raise ValueError(f"chunk attention: PARTS {parts}: 1, or 3 and more (the prefix in PARTS - 2 spans, the ring, "
                         f"the row's own keys)")
    if cascade and (parts != 1 or T < CASCADE_TILE["BLOCK_M"]):
        raise ValueError(f"chunk attention: the prefix read once per voice (CASCADE) takes PARTS 1 and rows of at least "
                         f"{CASCADE_TILE['BLOCK_M']} frames (a block of queries spans at most two rows); got PARTS "
                         f"{parts}, {T} frames")
    pdl = launch.pdl(q)
    if cascade:  # the prefix's part first: (max, sum) [2, H, B·T] and output [H, B·T, d], float32; then the rest
        part_ml = torch.empty(2, H, B * T, device=q.device, dtype=torch.float32)
        part_acc = torch.empty(H, B * T, d, device=q.device, dtype=torch.float32)
        _prefix_part[(triton.cdiv(B * T, CASCADE_TILE["BLOCK_M"]), H)](
            q, pk, pv, rows, part_ml, part_acc, B * T, T, frames, *q.stride()[:3], *pk.stride()[:3], *pv.stride()[:3],
            1.0 / math.sqrt(d), H=H, D=d, PRECISION="ieee" if q.dtype == torch.float32 else "tf32", PDL=pdl,
            launch_pdl=pdl, **CASCADE_TILE)
        frames = 0                     # (the kernel below reads the ring and the row's own keys, then merges)
    else:
        part_ml = part_acc = out       # unread
    # parts > 1: each part's running max and sum [parts, 2, B·H, T] and unnormalised output [parts, B·H, T, d]
    ml = torch.empty(parts, 2, B * H, T, device=q.device, dtype=torch.float32) if parts > 1 else out
    acc = torch.empty(parts, B * H, T, d, device=q.device, dtype=torch.float32) if parts > 1 else out
    grid = (triton.cdiv(T, config["BLOCK_M"]), B * H, parts)
    _chunk_attention[grid](q, k, v, pk, pv, hk, hv, out, ml, acc, part_ml, part_acc, rows, hrows, count, lengths,
                           *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *pk.stride()[:3], *pv.stride()[:3],
                           *hk.stride()[:3], *hv.stride()[:3], *out.stride()[:3], T, frames, chunk,
                           (LOG2E if lazy else 1.0) / math.sqrt(d), H=H, D=d, HISTORY=history is not None,
                           PARTS=parts, PREFIX_PARTS=parts - 2, CASCADE=cascade, LAZY=lazy, **config,
                           # float32 (tests): products in full precision; a GPU's default for them is tf32 (1e-3)
                           PRECISION="ieee" if q.dtype == torch.float32 else "tf32", PDL=pdl, launch_pdl=pdl)
    if parts > 1:
        _combine_parts[(triton.cdiv(T, 32), B * H)](ml, acc, out, B * H, T, *out.stride()[:3], H=H, D=d, PARTS=parts,
                                                     BLOCK_M=32, PDL=pdl, launch_pdl=pdl)
    return out.view(B, T, H * d)


if triton is not None:
    @triton.jit
    def _online_softmax_step(q, kt, v_ptrs, key_ok, allowed, m_i, l_i, acc, scale, PRECISION: tl.constexpr,
                             LAZY: tl.constexpr):
        """One block of keys (kt [D, N], values at v_ptrs [N, D]; key_ok [N]: inside the tensor) into the running
        max, sum and output of the queries (allowed [M, N]: what each may read). LAZY: scale includes log2(e), the
        scores and max are in base 2, and the max moves only when a block's passes it by 2^8 (so p ≤ 256: far inside
        float32's range, and bf16's relative precision does not depend on scale)."""
        if LAZY:
            s = tl.where(allowed, tl.dot(q, kt, input_precision=PRECISION) * scale, -1.0e30)
            m_blk = tl.max(s, 1)
            if tl.max(m_blk - m_i, 0) > 8.0:  # (one branch for the program: with one warp, no barrier)
                m_new = tl.maximum(m_i, m_blk)
                alpha = tl.exp2(m_i - m_new)
                acc = acc * alpha[:, None]
                l_i = l_i * alpha
                m_i = m_new
            p = tl.where(allowed, tl.exp2(s - m_i[:, None]), 0.0)
            v = tl.load(v_ptrs, mask=key_ok[:, None], other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
            return m_i, l_i + tl.sum(p, 1), acc
        s = tl.where(allowed, tl.dot(q, kt, input_precision=PRECISION) * scale, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.where(allowed, tl.exp(s - m_new[:, None]), 0.0)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_ptrs, mask=key_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        return m_new, l_i * alpha + tl.sum(p, 1), acc

    @triton.jit
    def _read_all(q, K0, sk_t, V0, sv_t, count, offs_m, offs_d, m_i, l_i, acc, scale, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr, LAZY: tl.constexpr):
        """Every query reads the `count` keys and values from K0, V0 on (one row and head of a prefix or a ring)."""
        for start in range(0, count, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            key_ok = offs_n < count
            allowed = key_ok[None, :] & (offs_m[:, None] >= 0)
            kt = tl.load(K0 + offs_n[None, :] * sk_t + offs_d[:, None], mask=key_ok[None, :], other=0.0)
            m_i, l_i, acc = _online_softmax_step(q, kt, V0 + offs_n[:, None] * sv_t + offs_d[None, :], key_ok, allowed,
                                                 m_i, l_i, acc, scale, PRECISION, LAZY)
        return m_i, l_i, acc

    @triton.jit
    def _chunk_attention(Q, K, V, KP, VP, KH, VH, O, ML, ACC, PART_ML, PART_ACC, ROWS, HROWS, COUNT, LENGTHS,
                         sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                         skp_r, skp_h, skp_t, svp_r, svp_h, svp_t, skh_r, skh_h, skh_t, svh_r, svh_h, svh_t,
                         so_b, so_t, so_h, T, frames, chunk, scale,
                         H: tl.constexpr, D: tl.constexpr, HISTORY: tl.constexpr, PARTS: tl.constexpr,
                         PREFIX_PARTS: tl.constexpr, CASCADE: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
                         LAZY: tl.constexpr):
        """PARTS 1: every key, then the output (LAZY, PARTS 1 and no CASCADE only: _online_softmax_step). PARTS > 1:
        part program_id(2) of the keys (the prefix's in PREFIX_PARTS spans, the ring, the row's own), then its running
        max, sum and output into ML and ACC.
        CASCADE (PARTS 1, frames 0): the prefix's part is in PART_ML, PART_ACC (_prefix_part), merged before the
        output."""
        inputs_ready(PDL)
        pid_m, bh, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        b, h = bh // H, bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :], mask=offs_m[:, None] < T,
                    other=0.0)
        length = tl.load(LENGTHS + b).to(tl.int32)
        limit = tl.zeros([BLOCK_M], tl.int32) + length              # a query reads the row's keys before this
        if chunk > 0:
            limit = tl.minimum((offs_m // chunk + 1) * chunk, limit)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        lo, n = 0, frames  # the prefix's keys this program reads
        if PARTS > 1:
            span = tl.cdiv(tl.cdiv(frames, PREFIX_PARTS), BLOCK_N) * BLOCK_N
            lo = part * span
            n = tl.where(part < PREFIX_PARTS, tl.minimum(tl.maximum(frames - lo, 0), span), 0)
        if n > 0:  # the prompt prefix: every query reads all of it
            m_i, l_i, acc = _read_all(q, KP + tl.load(ROWS + b) * skp_r + h * skp_h + lo * skp_t, skp_t,
                                      VP + tl.load(ROWS + b) * svp_r + h * svp_h + lo * svp_t, svp_t, n, offs_m,
                                      offs_d, m_i, l_i, acc, scale, BLOCK_N, PRECISION, LAZY)
        if HISTORY:  # the stream's earlier frames: every query reads all of them
            kept = tl.load(COUNT + b).to(tl.int32)
            if PARTS > 1:
                kept = tl.where(part == PARTS - 2, kept, 0)
            m_i, l_i, acc = _read_all(q, KH + tl.load(HROWS + b) * skh_r + h * skh_h, skh_t,
                                      VH + tl.load(HROWS + b) * svh_r + h * svh_h, svh_t, kept, offs_m, offs_d, m_i,
                                      l_i, acc, scale, BLOCK_N, PRECISION, LAZY)
        hi = tl.minimum(tl.max(limit, 0), T)
        if PARTS > 1:
            hi = tl.where(part == PARTS - 1, hi, 0)  # (the last part reads the row's own keys)
        for start in range(0, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            key_ok = offs_n < hi
            allowed = offs_n[None, :] < limit[:, None]
            kt = tl.load(K + b * sk_b + h * sk_h + offs_n[None, :] * sk_t + offs_d[:, None], mask=key_ok[None, :],
                         other=0.0)
            v_ptrs = V + b * sv_b + h * sv_h + offs_n[:, None] * sv_t + offs_d[None, :]
            m_i, l_i, acc = _online_softmax_step(q, kt, v_ptrs, key_ok, allowed, m_i, l_i, acc, scale, PRECISION, LAZY)
        if PARTS > 1:
            at = (part * 2 * tl.num_programs(1) + bh) * T + offs_m      # ML [PARTS, 2, B·H, T]
            tl.store(ML + at, m_i, mask=offs_m < T)
            tl.store(ML + at + tl.num_programs(1) * T, l_i, mask=offs_m < T)
            tl.store(ACC + ((part * tl.num_programs(1) + bh) * T + offs_m[:, None]) * D + offs_d[None, :], acc,
                     mask=offs_m[:, None] < T)
        else:
            if CASCADE:  # the prefix's part of the same queries, as one walk over every key would have it
                BT = tl.num_programs(1) // H * T
                g = b * T + offs_m
                ok = offs_m < T
                m0 = tl.load(PART_ML + h * BT + g, mask=ok, other=-1.0e30)
                l0 = tl.load(PART_ML + (H + h) * BT + g, mask=ok, other=0.0)
                acc0 = tl.load(PART_ACC + (h * BT + g)[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
                m = tl.maximum(m_i, m0)
                mine, theirs = tl.exp(m_i - m), tl.exp(m0 - m)
                acc = acc * mine[:, None] + acc0 * theirs[:, None]
                l_i = l_i * mine + l0 * theirs
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]          # a query with no key (a row of none): 0
            tl.store(O + b * so_b + offs_m[:, None] * so_t + h * so_h + offs_d[None, :], out.to(O.dtype.element_ty),
                     mask=offs_m[:, None] < T)

    @triton.jit
    def _prefix_part(Q, KP, VP, ROWS, ML, ACC, BT, T, frames, sq_b, sq_h, sq_t, skp_r, skp_h, skp_t, svp_r, svp_h,
                     svp_t, scale, H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     PRECISION: tl.constexpr, PDL: tl.constexpr):
        """Every query's attention over its row's voice prefix (all of it: the prefix's frames are whole chunks
        before the row's), BLOCK_M queries of consecutive rows at once → (running max, sum) ML [2, H, B·T] and
        unnormalised output ACC [H, B·T, D], float32. Rows of T >= BLOCK_M frames: a block spans at most two rows,
        which read one prefix row or two (a voice's CFG half: consecutive rows mostly share one)."""
        inputs_ready(PDL)
        h = tl.program_id(1)
        start = tl.program_id(0) * BLOCK_M
        offs_g = start + tl.arange(0, BLOCK_M)                           # queries, row-major over (row, frame)
        ok = offs_g < BT
        b = offs_g // T
        offs_d = tl.arange(0, D)
        q = tl.load(Q + b[:, None] * sq_b + h * sq_h + (offs_g % T)[:, None] * sq_t + offs_d[None, :],
                    mask=ok[:, None], other=0.0)
        first, last = start // T, (tl.minimum(start + BLOCK_M, BT) - 1) // T
        p0, p1 = tl.load(ROWS + first), tl.load(ROWS + last)
        prow = tl.where(b == first, p0, p1)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for part in tl.static_range(2):                                  # the first row's prefix row, then the last's
            p = p0 if part == 0 else p1
            if part == 0 or p1 != p0:
                mine = ok & (prow == p)
                m_i, l_i, acc = _read_all(q, KP + p * skp_r + h * skp_h, skp_t, VP + p * svp_r + h * svp_h, svp_t,
                                          frames, tl.where(mine, 0, -1), offs_d, m_i, l_i, acc, scale, BLOCK_N,
                                          PRECISION, False)
        tl.store(ML + h * BT + offs_g, m_i, mask=ok)
        tl.store(ML + (H + h) * BT + offs_g, l_i, mask=ok)
        tl.store(ACC + (h * BT + offs_g)[:, None] * D + offs_d[None, :], acc, mask=ok[:, None])

    @triton.jit
    def _combine_parts(ML, ACC, O, BH, T, so_b, so_t, so_h, H: tl.constexpr, D: tl.constexpr, PARTS: tl.constexpr,
                       BLOCK_M: tl.constexpr, PDL: tl.constexpr):
        """The parts' running maxima, sums and outputs → each query's output, as one walk over every key gives."""
        inputs_ready(PDL)
        bh = tl.program_id(1)
        b, h = bh // H, bh % H
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        ok = offs_m < T
        m = tl.full([BLOCK_M], -1.0e30, tl.float32)
        for p in tl.static_range(PARTS):
            m = tl.maximum(m, tl.load(ML + (p * 2 * BH + bh) * T + offs_m, mask=ok, other=-1.0e30))
        total = tl.zeros([BLOCK_M], tl.float32)
        out = tl.zeros([BLOCK_M, D], tl.float32)
        for p in tl.static_range(PARTS):
            weight = tl.exp(tl.load(ML + (p * 2 * BH + bh) * T + offs_m, mask=ok, other=-1.0e30) - m)
            total += weight * tl.load(ML + ((p * 2 + 1) * BH + bh) * T + offs_m, mask=ok, other=0.0)
            out += weight[:, None] * tl.load(ACC + ((p * BH + bh) * T + offs_m[:, None]) * D + offs_d[None, :],
                                             mask=ok[:, None], other=0.0)
        out = out / tl.where(total > 0, total, 1.0)[:, None]          # a query with no key (a row of none): 0
        tl.store(O + b * so_b + offs_m[:, None] * so_t + h * so_h + offs_d[None, :], out.to(O.dtype.element_ty),
                 mask=ok[:, None])
