"""A run of the estimator's transformer blocks (a U-Net level's) as one persistent kernel.

Each transformer block is seven kernels launched one after another (q|k|v product, attention, output product, the
per-frame sum and norm, the feed-forward's two products, the next block's norm), and an Euler step of the real-size
estimator ~600. A call of a stream or two is bound by their count: each kernel, however small, costs its launch, its
programs' start and its drain, ~3 us (docs/benchmarks.md). Here one launch runs every block of a level, the same seven
stages in order, and the stages are separated by a grid-wide barrier instead of a kernel boundary:

- the grid is persistent: as many programs as the multiprocessors left to the vocoder hold at once (`programs()`),
  each taking the stage's tiles pid, pid + G, ... (GEMM tiles of 64 frames by 64 channels; attention's query blocks
  of a row and head; per-frame tasks of 16 frames);
- a stage's prologue and epilogue live in its tiles: the bias, the residual and the exact GELU on the float32 sums
  before the one rounding, and the attention's keys and values of a stream's new frames written into its ring (the
  stream history, history.py) by the output stage, once every query has read the ring;
- the barrier (`_grid_sync`) is a counter and a generation word in global memory: the last program to arrive
  resets the counter and advances the generation, the others spin on it. Every program must be resident at once, so
  the grid never exceeds what the vocoder's MPS share leaves it (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE);
- the blocks' weights are read from one stacked tensor per kind (`stacked()`: the blocks' own parameters become
  views of it, so a state dict loaded later lands there), the prompt prefix's and the stream history's keys and
  values by attention slot from their stacked caches.

In Triton's interpreter (the CPU tests) programs run one after another, so a barrier cannot wait: there the stages
run as one launch each (`SYNC` off), which computes the same thing. Same bf16 math as the per-block path (the
products' sums in float32, rounded once; LayerNorms in float32), so the two agree to bf16 rounding, not bit for bit.

Measured on an H200 (2026-11-29, docs/benchmarks.md), and therefore off (`ENABLED`): correct (mel 55 dB SNR against the
per-block path; a run of 4 blocks 47 dB) and 560 → 185-196 kernels an Euler step, but slower at every size. A first
call 21.9 → 31.1 ms, a steady call of 32 streams 63.7 → 136.0 ms. Each barrier costs 1.76 us (132 programs), about
what a kernel boundary costs in a CUDA graph with programmatic dependent launch, so replacing one with the other
gains nothing at a first call's 80 rows. The stages alone are no faster than the kernels they replace: q|k|v 2.4 us,
ff2 4.5 us. At 5,120 rows the products in 1-2 programs a multiprocessor run ~2.5x cuBLAS's time (q|k|v 21 against
~8 us; pipelining the tile loop with the K loop was slower still). What would win is fewer dependent steps a
block and a cheaper sync, not launches traded for barriers: a thread-block cluster's barrier costs 0.18 us against
the grid barrier's 1.65-1.86 (bench/studies/cluster_barrier.py), so the next design owns a stream's rows on a
cluster (docs/benchmarks.md).

Shapes: x, normed [B, T, C] (B: the CFG pair's rows, 2 per stream), q|k|v [B·T, 3·H·D], attention out [B·T, H·D],
feed-forward [B·T, 4·C]; lengths [B] int32.
"""

from __future__ import annotations

import functools
import math
import os

import torch

from services.vocoder.codec import frame_ops

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (CI installs triton; the per-block path needs none)
    triton = None
else:
    from services.vocoder.codec.chunk_attention import _online_softmax_step, _read_all
    from services.vocoder.codec.frame_ops import _layer_norm
    from services.vocoder.codec.fused_linear import exact_gelu

ENABLED = False         # off: slower than the per-block kernels at every call size measured (module docstring)
STAGES = 7              # per block: q|k|v, attention, output (+ keep), norm3, ff1 + GELU, ff2, the next block's norm1
TILE = (64, 64)         # GEMM tile: frames x channels
ROWS = 16               # frames per per-frame task
PROGRAMS_PER_SM = 1
NUM_STAGES = 3          # the products' K loops: loads in flight
FLATTEN = False         # the products' tile and K loops pipelined as one
LAUNCHES_PER_STEP = 210  # an Euler step's kernels at the real size through the kernel, at most (a first call: 185-203
PER_BLOCK_LAUNCHES_PER_STEP = 620  # measured) and through the per-block kernels (549-605; tests/test_megakernel.py)


def usable(x: torch.Tensor, prefix) -> bool:
    """Whether a call's blocks run as one kernel: on a GPU with the kernel on, and a prefix (or stream history) view or
    none (a Recorder keeps whole keys, per block)."""
    return ENABLED and frame_ops.on_gpu(x) and not getattr(prefix, "recording", False)


@functools.lru_cache(maxsize=None)
def programs(device: torch.device) -> int:
    """The multiprocessors the vocoder's MPS share leaves it: the persistent grid is PROGRAMS_PER_SM times them, every
    program resident at once."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    share = float(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100") or 100)
    return max(1, int(sms * min(share, 100.0) / 100.0))


# ---- the blocks' weights, stacked --------------------------------------------------------------------------
KINDS = ("qkv", "out_w", "out_b", "norm3_w", "norm3_b", "ff1_w", "ff1_b", "ff2_w", "ff2_b", "norm1_w", "norm1_b")


def _parts(block) -> dict:
    """A block's tensors by kind (the attention's stacked q|k|v weight [3·H·D, C] is estimator.laid_out's)."""
    gelu, _, out = block.ff.net
    return dict(qkv=block.attn1.qkv_weight, out_w=block.attn1.to_out[0].weight, out_b=block.attn1.to_out[0].bias,
                norm3_w=block.norm3.weight, norm3_b=block.norm3.bias, ff1_w=gelu.proj.weight, ff1_b=gelu.proj.bias,
                ff2_w=out.weight, ff2_b=out.bias, norm1_w=block.norm1.weight, norm1_b=block.norm1.bias)


def stacked(blocks) -> dict[str, torch.Tensor]:
    """Every transformer block of the estimator, in slot order → {kind: [blocks, ...]}, made once: each block's
    tensors are then views of it (a state dict loaded later, or the q|k|v buffer made again, is seen and stacked
    again)."""
    owner = blocks[0]
    cache = getattr(owner, "_megakernel_stack", None)
    if cache is not None and all(t.data_ptr() == cache[k][i].data_ptr() for i, b in enumerate(blocks)
                                 for k, t in _parts(b).items()):
        return cache
    parts = [_parts(b) for b in blocks]
    # (tensors of the parameters' kind: normal ones take a later load_state_dict's copies, inference ones stay such)
    with torch.inference_mode(parts[0]["qkv"].is_inference()), torch.no_grad():
        cache = {k: torch.stack([p[k].detach() for p in parts]) for k in KINDS}
    for i, block in enumerate(blocks):
        gelu, _, out = block.ff.net
        attn = block.attn1
        attn.qkv_weight = cache["qkv"][i]
        for module, w, b in ((attn.to_out[0], "out_w", "out_b"), (block.norm3, "norm3_w", "norm3_b"),
                             (gelu.proj, "ff1_w", "ff1_b"), (out, "ff2_w", "ff2_b"), (block.norm1, "norm1_w", "norm1_b")):
            module.weight.data, module.bias.data = cache[w][i], cache[b][i]
    object.__setattr__(owner, "_megakernel_stack", cache)
    return cache


# ---- a run ------------------------------------------------------------------------------------------------
def run_blocks(all_blocks, first: int, count: int, x: torch.Tensor, normed: torch.Tensor, lengths: torch.Tensor,
               chunk: int, prefix=None, sync: bool | None = None, tile: tuple | None = None,
               per_sm: int | None = None, flatten: bool | None = None, num_warps: int = 4,
               stages: tuple[int, int] | None = None) -> torch.Tensor:
    """Blocks first … first + count - 1 of all_blocks (the estimator's transformer blocks in slot order) over x
    [B, T, C], normed = blocks[first].norm1(x) → x after them [B, T, C]. sync: one launch with grid barriers
    (default on a GPU), or a launch per stage (Triton's interpreter; a GPU too, to compare). tile (frames,
    channels), per_sm (programs a multiprocessor), flatten, num_warps: the defaults' alternatives
    (bench/studies/megakernel_stages.py sweeps them); stages: only stages [a, b) (the study times them alone)."""
    weights = stacked(all_blocks)
    block = all_blocks[first]
    attn = block.attn1
    B, T, C = x.shape
    H = attn.heads
    D = attn.to_q.out_features // H
    FF = weights["ff1_w"].shape[1]
    M = B * T
    dev, dt = x.device, x.dtype
    qkv = torch.empty(M, 3 * H * D, device=dev, dtype=dt)
    att = torch.empty(M, H * D, device=dev, dtype=dt)
    x2, n3 = torch.empty(M, C, device=dev, dtype=dt), torch.empty(M, C, device=dev, dtype=dt)
    hid = torch.empty(M, FF, device=dev, dtype=dt)
    # The first block reads the caller's x and normed where they lie (as element offsets from the run's own buffers:
    # no copies, and neither is written)
    x_in, normed_in = x.reshape(M, C).contiguous(), normed.reshape(M, C).contiguous()
    out, norm_ws = torch.empty(M, C, device=dev, dtype=dt), torch.empty(M, C, device=dev, dtype=dt)
    x_off, normed_off = _offset(x_in, out), _offset(normed_in, norm_ws)
    slot = attn.slot
    views = _attention_views(prefix, slot, count, qkv, lengths)
    if views is None:
        raise ValueError("megakernel: the prefix's or history's attention slots are not evenly spaced in one tensor")
    (kp, vp, prows, p_frames, p_slot, p_strides), (kh, vh, hrows, hcount, h_slot, h_strides, ring), keep = views
    keep_at, keep_len = keep
    w0 = {k: weights[k][first] for k in KINDS}
    block_strides = [weights[k].stride(0) for k in KINDS]
    bm, bn = tile or TILE
    bk = min(64, C)
    att_m = 16 if T <= 32 else 32
    counter = torch.zeros(2, dtype=torch.int32, device=dev)
    gpu = x.is_cuda
    sync = gpu if sync is None else sync
    grid = programs(dev) * (per_sm or PROGRAMS_PER_SM) if gpu else 4
    span = stages or (0, STAGES * count - 1)     # (no norm1 after the last block: the level's next op reads x)
    args = (out, norm_ws, qkv, att, x2, n3, hid, *[w0[k] for k in KINDS], lengths, kp, vp, prows, kh, vh, hrows, hcount,
            keep_at, keep_len, counter, counter[1:], x_off, normed_off, M, T, p_frames, chunk, 1.0 / math.sqrt(D),
            block.norm3.eps, block.norm1.eps, *block_strides, p_slot, *p_strides, h_slot, *h_strides, ring)
    meta = dict(C=C, H=H, D=D, FF=FF, PREFIX=p_frames > 0, HISTORY=kh is not None and hcount is not None,
                BM=bm, BN=bn, BK=bk, AM=att_m, AN=32, ROWS=ROWS, BLOCK_C=triton.next_power_of_2(C),
                IEEE=dt == torch.float32, PRECISION="ieee" if dt == torch.float32 else "tf32", num_warps=num_warps,
                num_stages=NUM_STAGES, FLATTEN=FLATTEN if flatten is None else flatten)
    args = tuple(a if a is not None else out for a in args)
    if sync:
        _blocks[(grid,)](*args, *span, SYNC=True, **meta)
    else:
        for s in range(*span):
            _blocks[(grid,)](*args, s, s + 1, SYNC=False, **meta)
    return out.view(B, T, C)


def _attention_views(prefix, slot: int, count: int, qkv: torch.Tensor, lengths: torch.Tensor):
    """What the run's attentions read and keep, as a base (slot `slot`'s), a slot stride and strides: ((prefix keys,
    values, rows, frames, slot stride, strides), (ring keys, values, rows, count, slot stride, strides, ring),
    (keep at, keep lengths)); None when the slots are not evenly spaced in one tensor."""
    none_p = (None, None, None, 0, 0, (0,) * 6)
    none_h = (None, None, None, None, 0, (0,) * 6, 1)
    if prefix is None:
        return none_p, none_h, (None, None)
    views = [prefix.kv(slot + i, None, None) for i in range(count)]
    found_p, found_h, keep = none_p, none_h, (None, None)
    if "prefix" in views[0]:
        parts = [v["prefix"] for v in views]
        stride = _slot_stride([p[0] for p in parts]), _slot_stride([p[1] for p in parts])
        if None in stride or stride[0] != stride[1]:
            return None
        k, v, rows = parts[0]
        found_p = (k, v, rows, k.shape[2], stride[0], (*k.stride()[:3], *v.stride()[:3]))
    if "history" in views[0]:
        parts = [v["history"] for v in views]
        stride = _slot_stride([p[0] for p in parts]), _slot_stride([p[1] for p in parts])
        if None in stride or stride[0] != stride[1]:
            return None
        k, v, rows, count_ = parts[0]
        found_h = (k, v, rows, count_, stride[0], (*k.stride()[:3], *v.stride()[:3]), k.shape[2])
        _, _, ring_k, _, keep_rows, at, keep_len = prefix.keep(slot, None, None)
        if ring_k.data_ptr() != k.data_ptr() or not torch.equal(keep_rows, rows):
            return None
        keep = (at, keep_len)
    return found_p, found_h, keep


def _offset(tensor: torch.Tensor, base: torch.Tensor) -> int:
    """Elements from base's first to tensor's (any two tensors of one dtype: device addresses are flat)."""
    gap = tensor.data_ptr() - base.data_ptr()
    assert gap % tensor.element_size() == 0
    return gap // tensor.element_size()


def _slot_stride(tensors) -> int | None:
    """The elements between consecutive slots' tensors, if even (one tensor's slices), else None."""
    if len(tensors) == 1:
        return 0
    size = tensors[0].element_size()
    gaps = {(b.data_ptr() - a.data_ptr()) for a, b in zip(tensors, tensors[1:])}
    if len(gaps) != 1:
        return None
    gap = gaps.pop()
    return gap // size if gap % size == 0 else None


if triton is not None:
    @triton.jit
    def _grid_sync(COUNT, GEN, nprog):
        """Every program of the grid arrives before any goes on; their writes before it are visible after it."""
        tl.debug_barrier()
        gen = tl.atomic_add(GEN, 0, sem="acquire", scope="gpu")
        arrived = tl.atomic_add(COUNT, 1, sem="acq_rel", scope="gpu")
        if arrived == nprog - 1:
            tl.atomic_xchg(COUNT, 0, sem="relaxed", scope="gpu")
            tl.atomic_add(GEN, 1, sem="release", scope="gpu")
        else:
            while tl.atomic_add(GEN, 0, sem="acquire", scope="gpu") == gen:
                pass
        tl.debug_barrier()

    @triton.jit
    def _linear(A, sa, W, BIAS, RES, OUT, so, M, N, K: tl.constexpr, pid, nprog, HAS_BIAS: tl.constexpr,
                GELU: tl.constexpr, RESIDUAL: tl.constexpr, IEEE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, FLATTEN: tl.constexpr):
        """OUT [M, N] = A [M, K] @ W[N, K].T (+ bias) (GELU) (+ RES [M, N], row stride so): this program's tiles."""
        tiles_n = tl.cdiv(N, BN)
        # FLATTEN: the tile loop and the K loop pipelined as one (the next tile's loads in flight while this one
        # computes), as Triton's persistent matmul does
        for tile in tl.range(pid, tl.cdiv(M, BM) * tiles_n, nprog, flatten=FLATTEN):
            offs_m = (tile // tiles_n) * BM + tl.arange(0, BM)
            offs_n = (tile % tiles_n) * BN + tl.arange(0, BN)
            offs_k = tl.arange(0, BK)
            row_ok, col_ok = offs_m < M, offs_n < N
            acc = tl.zeros([BM, BN], dtype=tl.float32)
            for k0 in range(0, K, BK):  # (a loop, not unrolled: its loads pipelined in NUM_STAGES buffers)
                a = tl.load(A + offs_m[:, None] * sa + (k0 + offs_k)[None, :], mask=row_ok[:, None], other=0.0,
                            cache_modifier=".cg")
                w = tl.load(W + offs_n[None, :] * K + (k0 + offs_k)[:, None], mask=col_ok[None, :], other=0.0)
                if IEEE:
                    acc = tl.dot(a, w, acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, w, acc)
            if HAS_BIAS:
                acc += tl.load(BIAS + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            if GELU:
                acc = exact_gelu(acc)
            ok = row_ok[:, None] & col_ok[None, :]
            if RESIDUAL:
                acc += tl.load(RES + offs_m[:, None] * so + offs_n[None, :], mask=ok, other=0.0,
                               cache_modifier=".cg").to(tl.float32)
            tl.store(OUT + offs_m[:, None] * so + offs_n[None, :], acc.to(OUT.dtype.element_ty), mask=ok)

    @triton.jit
    def _norm_rows(X, W, Bn, OUT, M, C, eps, pid, nprog, ROWS: tl.constexpr, BLOCK_C: tl.constexpr):
        """OUT [M, C] = LayerNorm(X [M, C]) · W + Bn, in float32: this program's tasks of ROWS frames."""
        offs_c = tl.arange(0, BLOCK_C)
        col_ok = offs_c < C
        for task in range(pid, tl.cdiv(M, ROWS), nprog):
            offs_m = task * ROWS + tl.arange(0, ROWS)
            ok = (offs_m < M)[:, None] & col_ok[None, :]
            x = tl.load(X + offs_m[:, None] * C + offs_c[None, :], mask=ok, other=0.0, cache_modifier=".cg")
            y = _layer_norm(x.to(tl.float32), col_ok, W, Bn, C, eps, BLOCK_C)
            tl.store(OUT + offs_m[:, None] * C + offs_c[None, :], y.to(OUT.dtype.element_ty), mask=ok)

    @triton.jit
    def _attention(QKV, OUT, LENGTHS, KP, VP, PROWS, KH, VH, HROWS, HCOUNT, T, rows, frames, chunk, scale,
                   skp_r, skp_h, skp_t, svp_r, svp_h, svp_t, skh_r, skh_h, skh_t, svh_r, svh_h, svh_t, pid, nprog,
                   H: tl.constexpr, D: tl.constexpr, PREFIX: tl.constexpr, HISTORY: tl.constexpr,
                   PRECISION: tl.constexpr, AM: tl.constexpr, AN: tl.constexpr):
        """Static-chunk attention of every row's queries (chunk_attention.py's rule: the prefix, then the ring, then
        the row's own keys before its chunk's end and its length) → OUT [rows·T, H·D]: this program's tasks, a block
        of AM queries of a row and head each. q, k, v at columns h·D, (H + h)·D, (2H + h)·D of QKV's rows."""
        s_row = 3 * H * D
        q_blocks = tl.cdiv(T, AM)
        offs_d = tl.arange(0, D)
        for task in range(pid, q_blocks * rows * H, nprog):
            qb, bh = task % q_blocks, task // q_blocks
            b, h = bh // H, bh % H
            offs_m = qb * AM + tl.arange(0, AM)
            base = QKV + b * T * s_row
            q = tl.load(base + offs_m[:, None] * s_row + h * D + offs_d[None, :], mask=offs_m[:, None] < T, other=0.0,
                        cache_modifier=".cg")
            length = tl.load(LENGTHS + b).to(tl.int32)
            limit = tl.zeros([AM], tl.int32) + length
            if chunk > 0:
                limit = tl.minimum((offs_m // chunk + 1) * chunk, limit)
            m_i = tl.full([AM], -1.0e30, tl.float32)
            l_i = tl.zeros([AM], tl.float32)
            acc = tl.zeros([AM, D], tl.float32)
            if PREFIX:
                prow = tl.load(PROWS + b)
                m_i, l_i, acc = _read_all(q, KP + prow * skp_r + h * skp_h, skp_t, VP + prow * svp_r + h * svp_h,
                                          svp_t, frames, offs_m, offs_d, m_i, l_i, acc, scale, AN, PRECISION, False)
            if HISTORY:
                hrow = tl.load(HROWS + b)
                m_i, l_i, acc = _read_all(q, KH + hrow * skh_r + h * skh_h, skh_t, VH + hrow * svh_r + h * svh_h,
                                          svh_t, tl.load(HCOUNT + b).to(tl.int32), offs_m, offs_d, m_i, l_i, acc,
                                          scale, AN, PRECISION, False)
            hi = tl.minimum(tl.max(limit, 0), T)
            for start in range(0, hi, AN):
                offs_n = start + tl.arange(0, AN)
                key_ok = offs_n < hi
                allowed = offs_n[None, :] < limit[:, None]
                kt = tl.load(base + offs_n[None, :] * s_row + (H + h) * D + offs_d[:, None], mask=key_ok[None, :],
                             other=0.0, cache_modifier=".cg")
                v_ptrs = base + offs_n[:, None] * s_row + (2 * H + h) * D + offs_d[None, :]
                m_i, l_i, acc = _online_softmax_step(q, kt, v_ptrs, key_ok, allowed, m_i, l_i, acc, scale, PRECISION,
                                                     False)
            o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]          # a query with no key (a row of none): 0
            tl.store(OUT + (b * T + offs_m[:, None]) * (H * D) + h * D + offs_d[None, :], o.to(OUT.dtype.element_ty),
                     mask=offs_m[:, None] < T)

    @triton.jit
    def _keep(QKV, KH, VH, HROWS, AT, KEEP_LEN, M, T, ring, skh_r, skh_h, skh_t, svh_r, svh_h, svh_t, pid, nprog,
              H: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr):
        """Each row's last min(length, ring) frames' keys and values into its ring, the i-th at (at + i) % ring
        (frame_ops.keep_reference): this program's tasks of ROWS frames."""
        s_row = 3 * H * D
        offs_d = tl.arange(0, D)
        for task in range(pid, tl.cdiv(M, ROWS), nprog):
            offs_m = task * ROWS + tl.arange(0, ROWS)
            row_ok = offs_m < M
            b, t = offs_m // T, offs_m % T
            n = tl.load(KEEP_LEN + b, mask=row_ok, other=0).to(tl.int32)
            kept = (row_ok & (t < n) & (t >= n - ring))[:, None]
            hrow = tl.load(HROWS + b, mask=row_ok, other=0)
            place = (tl.load(AT + b, mask=row_ok, other=0) + t) % ring
            for hh in tl.static_range(H):
                key = tl.load(QKV + offs_m[:, None] * s_row + (H + hh) * D + offs_d[None, :], mask=kept,
                              cache_modifier=".cg")
                tl.store(KH + hrow[:, None] * skh_r + hh * skh_h + place[:, None] * skh_t + offs_d[None, :], key,
                         mask=kept)
                value = tl.load(QKV + offs_m[:, None] * s_row + (2 * H + hh) * D + offs_d[None, :], mask=kept,
                                cache_modifier=".cg")
                tl.store(VH + hrow[:, None] * svh_r + hh * svh_h + place[:, None] * svh_t + offs_d[None, :], value,
                         mask=kept)

    @triton.jit
    def _blocks(X, NORMED, QKV, ATT, X2, N3, HID,
                WQKV, WOUT, BOUT, N3W, N3B, W1, B1, W2, B2, N1W, N1B,
                LENGTHS, KP, VP, PROWS, KH, VH, HROWS, HCOUNT, KEEP_AT, KEEP_LEN, COUNT, GEN, x_off, normed_off,
                M, T, frames, chunk, scale, eps3, eps1,
                sb_qkv, sb_out_w, sb_out_b, sb_n3w, sb_n3b, sb_ff1_w, sb_ff1_b, sb_ff2_w, sb_ff2_b, sb_n1w, sb_n1b,
                p_slot, skp_r, skp_h, skp_t, svp_r, svp_h, svp_t,
                h_slot, skh_r, skh_h, skh_t, svh_r, svh_h, svh_t, ring,
                first_stage, last_stage,
                C: tl.constexpr, H: tl.constexpr, D: tl.constexpr, FF: tl.constexpr, PREFIX: tl.constexpr,
                HISTORY: tl.constexpr, SYNC: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                AM: tl.constexpr, AN: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr, IEEE: tl.constexpr,
                PRECISION: tl.constexpr, FLATTEN: tl.constexpr):
        """Stages first_stage … last_stage - 1 of the run (stage s: block s // STAGES, kind s % STAGES), a grid
        barrier between two (SYNC). X holds the run's x, written at a block's end (the first block reads the caller's,
        x_off elements from X, and its normed, normed_off from NORMED)."""
        pid, nprog = tl.program_id(0), tl.num_programs(0)
        rows = M // T
        for s in range(first_stage, last_stage):
            blk, kind = s // 7, s % 7
            if kind == 0:      # q|k|v = norm1(x) @ Wqkv.T
                _linear(NORMED + tl.where(blk == 0, normed_off, 0), C, WQKV + blk * sb_qkv, BOUT, BOUT, QKV, 3 * H * D, M, 3 * H * D,
                        C, pid, nprog,
                        False, False, False, IEEE, BM, BN, BK, FLATTEN)
            elif kind == 1:    # attention over the prefix, the ring and the row's own keys
                _attention(QKV, ATT, LENGTHS, KP + blk * p_slot, VP + blk * p_slot, PROWS, KH + blk * h_slot,
                           VH + blk * h_slot, HROWS, HCOUNT, T, rows, frames, chunk, scale, skp_r, skp_h, skp_t,
                           svp_r, svp_h, svp_t, skh_r, skh_h, skh_t, svh_r, svh_h, svh_t, pid, nprog, H, D, PREFIX,
                           HISTORY, PRECISION, AM, AN)
            elif kind == 2:    # x2 = x + attention @ Wout.T + bout; the new frames' keys and values into the ring
                _linear(ATT, H * D, WOUT + blk * sb_out_w, BOUT + blk * sb_out_b, X + tl.where(blk == 0, x_off, 0), X2, C, M, C,
                        H * D, pid, nprog,
                        True, False, True, IEEE, BM, BN, BK, FLATTEN)
                if HISTORY:
                    _keep(QKV, KH + blk * h_slot, VH + blk * h_slot, HROWS, KEEP_AT, KEEP_LEN, M, T, ring, skh_r,
                          skh_h, skh_t, svh_r, svh_h, svh_t, pid, nprog, H, D, ROWS)
            elif kind == 3:    # norm3(x2)
                _norm_rows(X2, N3W + blk * sb_n3w, N3B + blk * sb_n3b, N3, M, C, eps3, pid, nprog, ROWS, BLOCK_C)
            elif kind == 4:    # GELU(norm3 @ W1.T + b1)
                _linear(N3, C, W1 + blk * sb_ff1_w, B1 + blk * sb_ff1_b, B1, HID, FF, M, FF, C, pid, nprog,
                        True, True, False, IEEE, BM, BN, BK, FLATTEN)
            elif kind == 5:    # x = x2 + hidden @ W2.T + b2
                _linear(HID, FF, W2 + blk * sb_ff2_w, B2 + blk * sb_ff2_b, X2, X, C, M, C, FF, pid, nprog,
                        True, False, True, IEEE, BM, BN, BK, FLATTEN)
            else:              # the next block's norm1(x)
                _norm_rows(X, N1W + (blk + 1) * sb_n1w, N1B + (blk + 1) * sb_n1b, NORMED, M, C, eps1, pid, nprog,
                           ROWS, BLOCK_C)
            if SYNC:
                if s < last_stage - 1:
                    _grid_sync(COUNT, GEN, nprog)
