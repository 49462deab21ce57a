"""The estimator's attention kernel (codec/chunk_attention.py) by tile configuration, against PyTorch's form (an
additive mask and scaled_dot_product_attention), at the real shapes. One run, one GPU:

    python bench/studies/codec_kernels.py --json out.json

Shapes: 8 heads of 64, static chunks of 20 frames; a first block alone (2 CFG rows of 192 frames, no prefix), 16 and
32 streams after the prompt prefix (32 and 64 rows of 180 frames reading 140 prefix frames); and with a stream history
(codec/history.py): a first call (40 frames after the prefix, no kept frames), steady calls (80 new frames after the
prefix and a full ring of 40) of 1, 3, 6, 16 and 32 streams. Each cell is the op replayed 50 times from one CUDA
graph (as the vocoder runs it), per op. The configurations: tiles of queries by keys, each program walking all of its
keys, or (`pN`) its keys in N parts side by side and then a combine; `sN`: N pipeline stages (Triton's default 3);
`lazy`: the running max kept lazily (chunk_attention's LAZY); `rN`: at most N registers a thread.
The row marked `default` is what chunk_attention.tiles() picks; the table says whether it is the best.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch

from measure import gpu_record, graph_time
from services.vocoder.codec import chunk_attention

REPS = 50
SHAPES = {"first block": (2, 192, 0, 0), "16 streams": (32, 180, 140, 0), "32 streams": (64, 180, 140, 0),  # rows, T,
          "history first": (2, 40, 140, 0), "history 1": (2, 80, 140, 40),                                 # prefix, ring
          "history 3": (6, 80, 140, 40), "history 6": (12, 80, 140, 40),  # the stack's calls under load
          "history 16": (32, 80, 140, 40), "history 32": (64, 80, 140, 40)}
CONFIGS = {f"{m}x{n} w{w}": dict(BLOCK_M=m, BLOCK_N=n, num_warps=w)
           for m, n, w in ((64, 64, 4), (32, 64, 4), (64, 32, 4), (128, 64, 8), (64, 128, 4), (32, 32, 2), (16, 64, 2),
                           (16, 32, 2), (16, 16, 1), (16, 128, 4), (16, 128, 2), (32, 128, 4))}
# deeper and shallower pipelines for the tile a history of 32 streams takes
CONFIGS.update({f"16x16 w1 s{st}": dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=st) for st in (2, 4)})
# the max kept lazily (LAZY: fewer instructions a step), in the tiles tiles() picks and with more keys a step
CONFIGS.update({f"{m}x{n} w{w} lazy": dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, LAZY=True)
                for m, n, w in ((16, 16, 1), (16, 32, 1), (16, 64, 1), (64, 32, 4), (32, 64, 4))})
# the lazy max held to the every-block step's registers (r96: 20 one-warp programs a multiprocessor; it takes 98
# alone, which leaves 16 and a second wave at 32 streams: ncu, 2026-12-02); r96 is chunk_attention.SMALL_TILE
CONFIGS.update({f"16x16 w1 lazy r{r}": dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, LAZY=True, maxnreg=r) for r in (96, 88)})
# the keys in parts side by side, then combined: PARTS 3 (the prefix whole, the ring, the row's own) or 4
CONFIGS.update({f"{m}x{n} w{w} p{p}": dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, PARTS=p)
                for m, n, w, p in ((64, 32, 4, 4), (64, 32, 4, 3), (32, 32, 2, 4), (64, 64, 4, 4), (32, 64, 4, 4),
                                   (16, 64, 2, 4))})


def inputs(shape: str, device: torch.device, gen: torch.Generator):
    """One cell's attention inputs in bf16: q, k, v [B, 8, T, 64] (strided, as the estimator's projection leaves
    them), lengths [B], the prompt prefix (keys, values [2, 8, frames, 64], rows) and a history's ring or None."""
    B, T, frames, ring = SHAPES[shape]
    x = torch.randn(B, T, 3, 8, 64, generator=gen, device=device).to(torch.bfloat16)
    q, k, v = x.permute(2, 0, 3, 1, 4).unbind(0)
    lengths = torch.full((B,), T, dtype=torch.int32, device=device)
    prefix = None
    if frames:
        pk, pv = (torch.randn(2, 8, frames, 64, generator=gen, device=device).to(torch.bfloat16) for _ in range(2))
        prefix = (pk, pv, torch.arange(B, device=device) % 2)
    history = None
    if shape.startswith("history"):
        hk, hv = (torch.randn(B, 8, 40, 64, generator=gen, device=device).to(torch.bfloat16) for _ in range(2))
        history = (hk, hv, torch.arange(B, device=device), torch.full((B,), ring, device=device))
    return q, k, v, lengths, prefix, history


def per_op(fn, device) -> float:
    """Seconds per call of fn, replayed REPS times from one CUDA graph."""
    return graph_time(fn, REPS, 10, device) / REPS


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    out = gpu_record()
    for shape, (B, T, frames, ring) in SHAPES.items():
        q, k, v, lengths, prefix, history = inputs(shape, device, gen)
        want = chunk_attention.reference(q, k, v, lengths, 20, prefix, history).float()
        cell = {"pytorch_us": per_op(lambda: chunk_attention.reference(q, k, v, lengths, 20, prefix, history), device) * 1e6,
                "default": chunk_attention.tiles(B, 8, T, frames + ring, history is not None), "configs": {}}
        for name, config in {"default": None, **CONFIGS}.items():
            got = chunk_attention.kernel(q, k, v, lengths, 20, prefix, config, history)
            err = (got.float() - want).abs().max().item()
            us = per_op(lambda: chunk_attention.kernel(q, k, v, lengths, 20, prefix, config, history), device) * 1e6
            cell["configs"][name] = {"us": us, "max_abs_err": err}
        out["cells"][shape] = cell
    print(f"{out['gpu']}, torch {out['torch']}, {out['date']}: us per op, replayed from a CUDA graph")
    names = ["default", *CONFIGS]
    print(f"{'shape':12s} {'sdpa':>6s} " + " ".join(f"{n:>10s}" for n in names))
    for shape, cell in out["cells"].items():
        print(f"{shape:12s} {cell['pytorch_us']:6.1f} " + " ".join(f"{cell['configs'][n]['us']:10.1f}" for n in names))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
