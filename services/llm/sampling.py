"""The sampling rules on tensors: the noise hash, top-k, top-p and the Gumbel-max draw, numerically safe.

Shared by the engine's Sampler (engine/sampler.py, which owns the per-slot state and picks the path) and the fused
Triton path (runner/kernels/sampling.py, which computes the same formulas): neither imports the other's package
for them. Why the noise is a hash and what "safe" means: engine/sampler.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_BELOW = 1e-5   # temperatures under this sample greedily
TOPK_CAP = 64         # when every sampling row has 0 < top_k <= TOPK_CAP // 2, only TOPK_CAP candidates are sorted
FINITE_MAX = 3.0e38   # float32 max is 3.4e38: room to subtract a row maximum without overflow to NaN
MASK32 = 0xFFFFFFFF
TEXT_SALT, AUDIO_SALT = 0x68E31DA4, 0x1B56C4E9


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & MASK32
    return x ^ (x >> 16)


def hashed_uniform(seed: torch.Tensor, step: torch.Tensor, token: torch.Tensor, salt: int) -> torch.Tensor:
    """u in (0, 1), float32, for each (row, token): seed, step [R] int64; token [R, K] int64."""
    row = _fmix32(((seed & MASK32) ^ salt) & MASK32)
    row = _fmix32(row ^ ((seed >> 32) & MASK32) ^ ((step * 0x9E3779B9) & MASK32))  # [R]
    h = _fmix32(row[:, None] ^ ((token * 0x27D4EB2F) & MASK32))  # [R, K]
    return ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))


@dataclass
class RowSettings:
    """Per-row sampling settings on the device, all [R]."""

    temperature: torch.Tensor  # float32
    top_p: torch.Tensor        # float32
    penalty: torch.Tensor      # float32
    top_k: torch.Tensor        # int64, 0 → the whole vocabulary
    seed: torch.Tensor         # int64
    step: torch.Tensor         # int64: tokens the request has sampled so far
    slot: torch.Tensor         # int64: row in the seen-token masks
    block_eosp: torch.Tensor   # bool: eosp suppressed (before min_new_tokens)


def top_candidates(z: torch.Tensor, k: int, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(z, k) of each row of z [R, V] → (values [R, k] descending, ids [R, k]), in two stages
    when V is large: the top k of each `chunk`-wide slice, then the top k of those. A one-stage topk
    over 16512 audio logits runs one thread block per row (~90 µs on an H100 at batch 1); slices
    spread a row over many blocks. Same values; among equal values the ids may differ."""
    rows, vocab = z.shape
    slices = vocab // chunk
    if slices < 2 or chunk < k:
        return torch.topk(z, k, dim=1)
    width = -(-vocab // slices)
    padded = torch.nn.functional.pad(z, (0, slices * width - vocab), value=float("-inf"))
    vals, ids = torch.topk(padded.view(rows * slices, width), k, dim=1)          # [R·slices, k]
    ids = ids.view(rows, slices, k) + torch.arange(0, slices * width, width, device=z.device)[:, None]
    vals, pick = torch.topk(vals.view(rows, slices * k), k, dim=1)
    return vals, ids.view(rows, slices * k).gather(1, pick).clamp(max=vocab - 1)  # a padding id only ever has -inf


def sample_rows(logits: torch.Tensor, rows: RowSettings, seen: torch.Tensor, salt: int,
                candidates: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V] float32 (already masked), seen [R, V] bool → (token ids [R] int64, ok [R] bool).

    candidates: sort only the top `candidates` logits (every row's top_k must fit, see TOPK_CAP), or
    None to sort the whole vocabulary (a row with top_k 0 or a large top_k)."""
    vocab = logits.shape[1]
    ok = ~torch.isnan(logits).any(1) & ~torch.isposinf(logits).any(1)
    pen = rows.penalty[:, None]
    x = torch.where(seen, torch.where(logits > 0, logits / pen, logits * pen), logits)
    x = torch.nan_to_num(x, nan=float("-inf"), posinf=FINITE_MAX).clamp(max=FINITE_MAX)
    greedy = x.argmax(1)
    # Tempered logits relative to the row maximum: <= 0 everywhere, 0 at the maximum, -inf where masked.
    z = (x - x.max(1, keepdim=True).values) / rows.temperature.clamp(min=GREEDY_BELOW)[:, None]
    if candidates is None:
        z_sorted, order = torch.sort(z, dim=1, descending=True)
    else:
        z_sorted, order = top_candidates(z, min(candidates, vocab))
    k = torch.where((rows.top_k <= 0) | (rows.top_k > vocab), vocab, rows.top_k).clamp(max=z_sorted.shape[1])
    kth = z_sorted.gather(1, (k - 1)[:, None])                       # [R, 1]
    z_sorted = z_sorted.masked_fill(z_sorted < kth, float("-inf"))   # top-k, ties at the k-th value kept
    probs = torch.softmax(z_sorted, dim=1)
    # top-p: keep a token unless the tokens ranked above it already cover top_p (the first always stays);
    # the cut is by value, so tokens tied with the last kept one stay whatever order the sort gave them.
    covered = probs.cumsum(1) - probs
    last_kept = ((covered <= rows.top_p[:, None]) & (z_sorted > float("-inf"))).sum(1).clamp(min=1) - 1
    z_sorted = z_sorted.masked_fill(z_sorted < z_sorted.gather(1, last_kept[:, None]), float("-inf"))
    u = hashed_uniform(rows.seed, rows.step, order, salt)
    pick = (z_sorted - torch.log(-torch.log(u))).argmax(1)
    sampled = order.gather(1, pick[:, None]).squeeze(1)
    return torch.where(rows.temperature < GREEDY_BELOW, greedy, sampled), ok
