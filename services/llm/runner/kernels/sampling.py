"""The sampler's candidate path in three launches instead of ~60: a Triton kernel over the whole vocabulary
(masks, repetition penalty, finiteness, row maximum and greedy pick, tempered logits), a top-k of the
candidates (`top_candidates`, torch), and a Triton kernel over those candidates (top-k and top-p cuts,
hashed Gumbel noise, the draw).

The math is services/llm/sampling.py `sample_rows` step for step (same formulas in float32, same hash), which
stays the reference and the full-vocabulary path; tests hold the two to the same tokens. At batch 1 the
~60 small kernels of the torch version cost ~0.15 ms of GPU time per step plus the gaps between them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.llm import sampling as rules

# The torch version's constants, as constexprs (compiled Triton reads no other globals).
FINITE_MAX = tl.constexpr(rules.FINITE_MAX)
GREEDY_BELOW = tl.constexpr(rules.GREEDY_BELOW)


@triton.jit
def _fmix32(x):
    """murmur3's 32-bit finaliser on int64 values in [0, 2**32), masked exactly as the torch version is."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _prepare_kernel(logits_ptr, seen_ptr, slot_ptr, penalty_ptr, temperature_ptr, block_eosp_ptr,
                    z_ptr, greedy_ptr, ok_ptr, vocab, limit, eosp, stride_l, stride_seen, stride_z,
                    BLOCK: tl.constexpr):
    """Grid (R,). Row r: x = logits masked (ids >= limit; eosp while blocked), ok = no NaN or +inf left,
    x penalised where seen, NaN → -inf, clamped to ±FINITE_MAX; greedy = first argmax of x;
    z = (x - max x) / max(temperature, GREEDY_BELOW)."""
    r = tl.program_id(0).to(tl.int64)
    pen = tl.load(penalty_ptr + r)
    temp = tl.maximum(tl.load(temperature_ptr + r), GREEDY_BELOW)
    blocked = tl.load(block_eosp_ptr + r) != 0
    seen_row = seen_ptr + tl.load(slot_ptr + r) * stride_seen
    best = tl.full([], float("-inf"), tl.float32)
    best_id = tl.full([], 0, tl.int64)
    bad = tl.full([], 0, tl.int32)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        live = cols < vocab
        x = tl.load(logits_ptr + r * stride_l + cols, mask=live, other=float("-inf")).to(tl.float32)
        x = tl.where((cols >= limit) | ((cols == eosp) & blocked), float("-inf"), x)
        bad += tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), 0)
        seen = tl.load(seen_row + cols, mask=live, other=0) != 0
        x = tl.where(seen, tl.where(x > 0, x / pen, x * pen), x)
        x = tl.where(x != x, float("-inf"), x)
        x = tl.minimum(x, FINITE_MAX)
        tl.store(z_ptr + r * stride_z + cols, x, mask=live)
        m = tl.max(x, 0)
        first = tl.min(tl.where((x == m) & live, cols, vocab), 0).to(tl.int64)
        take = m > best
        best_id = tl.where(take, first, best_id)
        best = tl.where(take, m, best)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        live = cols < vocab
        x = tl.load(z_ptr + r * stride_z + cols, mask=live)
        tl.store(z_ptr + r * stride_z + cols, (x - best) / temp, mask=live)
    tl.store(greedy_ptr + r, best_id)
    tl.store(ok_ptr + r, (bad == 0).to(tl.int8))


@triton.jit
def _pick_kernel(z_ptr, order_ptr, top_k_ptr, top_p_ptr, temperature_ptr, seed_ptr, step_ptr, greedy_ptr,
                 out_ptr, vocab, salt, stride_z, stride_o, K: tl.constexpr):
    """Grid (R,). Row r's K candidates (tempered logits, descending, and their ids) → the drawn id:
    top-k cut (ties at the k-th value kept), top-p cut by value, Gumbel-max with hashed uniforms."""
    r = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, K)
    z = tl.load(z_ptr + r * stride_z + i)
    order = tl.load(order_ptr + r * stride_o + i)
    top_k = tl.load(top_k_ptr + r)
    k = tl.where((top_k <= 0) | (top_k > vocab), vocab, top_k)
    k = tl.minimum(k, K)
    kth = tl.max(tl.where(i == k - 1, z, float("-inf")), 0)
    z = tl.where(z < kth, float("-inf"), z)
    e = tl.exp(z - tl.max(z, 0))
    p = e / tl.sum(e, 0)
    covered = tl.cumsum(p, 0) - p
    kept = tl.sum(((covered <= tl.load(top_p_ptr + r)) & (z > float("-inf"))).to(tl.int32), 0)
    last = tl.maximum(kept, 1) - 1
    z = tl.where(z < tl.max(tl.where(i == last, z, float("-inf")), 0), float("-inf"), z)
    # u = hashed_uniform(seed, step, token, salt) of services/llm/sampling.py, in uint32 arithmetic.
    mask32 = 0xFFFFFFFF
    seed = tl.load(seed_ptr + r)
    step = tl.load(step_ptr + r)
    h = _fmix32(((seed & mask32) ^ salt) & mask32)
    h = _fmix32(h ^ ((seed >> 32) & mask32) ^ ((step * 0x9E3779B9) & mask32))
    h = _fmix32(h ^ ((order * 0x27D4EB2F) & mask32))  # [K]
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    score = z - tl.log(-tl.log(u))
    best = tl.max(score, 0)
    pick = tl.min(tl.where(score == best, i, K), 0)
    token = tl.sum(tl.where(i == pick, order, 0), 0)
    greedy = tl.load(greedy_ptr + r)
    tl.store(out_ptr + r, tl.where(tl.load(temperature_ptr + r) < GREEDY_BELOW, greedy, token))


def sample_candidates(logits, seen, rows, salt: int, candidates: int, limit: int | None = None, eosp: int = -1):
    """logits [R, V] float32 (unmasked), seen [slots, V] bool (all slots; rows.slot picks), rows: the
    sampler's RowSettings → (ids [R] int64, ok [R] bool). limit: ids at or above are masked; eosp: the
    id masked in rows whose block_eosp is set (-1: none). Every row's top_k must fit in `candidates`."""
    n, vocab = logits.shape
    z = torch.empty_like(logits)
    greedy = torch.empty(n, dtype=torch.long, device=logits.device)
    ok = torch.empty(n, dtype=torch.int8, device=logits.device)
    if n == 0:
        return greedy, ok.bool()
    _prepare_kernel[(n,)](logits, seen.view(torch.uint8), rows.slot, rows.penalty, rows.temperature,
                          rows.block_eosp.view(torch.uint8), z, greedy, ok, vocab, vocab if limit is None else limit,
                          eosp, logits.stride(0), seen.stride(0), z.stride(0), BLOCK=1024, num_warps=4)
    z_sorted, order = rules.top_candidates(z, candidates)
    out = torch.empty(n, dtype=torch.long, device=logits.device)
    _pick_kernel[(n,)](z_sorted, order, rows.top_k, rows.top_p, rows.temperature, rows.seed, rows.step, greedy, out,
                       vocab, salt, z_sorted.stride(0), order.stride(0), K=z_sorted.shape[1], num_warps=1)
    return out, ok.bool()
