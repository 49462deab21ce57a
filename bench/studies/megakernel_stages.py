"""Where a persistent run of the estimator's transformer blocks spends its time (codec/megakernel.py), on one GPU.

    python bench/studies/megakernel_stages.py --json out.json

A U-Net level's 4 blocks at the real size (random weights, bf16, own keys only: no prefix or history), at a first
call's rows (one stream: 2 x 40 frames) and a steady call's of 32 streams (64 x 80), each timed as a CUDA graph's
replays (median):
- the per-block path (7-8 kernels a block) and the persistent kernel's variants (tiles, programs a multiprocessor,
  the products' tile and K loops pipelined as one, warps);
- the grid barrier alone: 27 barriers in one launch, at 1 and 2 programs a multiprocessor;
- each stage kind alone, one launch each, less an empty launch: what a stage's work costs without the barriers.
Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from measure import gpu_record
from services.vocoder.codec import megakernel
from services.vocoder.codec.config import EstimatorConfig
from services.vocoder.codec.estimator import CausalConditionalDecoder
from services.vocoder.codec.megakernel import _grid_sync

KINDS = ("q|k|v", "attention", "output", "norm3", "ff1 + GELU", "ff2", "norm1")
VARIANTS = {  # name: run_blocks keywords
    "64x64, 1/SM": {},
    "64x64, 1/SM, flat": dict(flatten=True),
    "64x64, 2/SM": dict(per_sm=2),
    "32x32, 2/SM": dict(tile=(32, 32), per_sm=2),
    "128x128, 8 warps, flat": dict(tile=(128, 128), num_warps=8, flatten=True),
}


@triton.jit
def _barriers(COUNT, GEN, n):
    for _ in range(n):
        _grid_sync(COUNT, GEN, tl.num_programs(0))


def timed(fn) -> float:
    """Microseconds a replay, median."""
    return do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--variants", default=";".join(VARIANTS), help="names, separated by ;")
    args = p.parse_args()
    dev = torch.device("cuda")
    out = gpu_record()
    with torch.inference_mode(False):  # (as the vocoder builds it: normal parameters)
        est = CausalConditionalDecoder(EstimatorConfig()).to(dev, torch.bfloat16).eval()
    blocks = est.transformer_blocks
    sms = megakernel.programs(dev)
    counter = torch.zeros(2, dtype=torch.int32, device=dev)
    for per_sm in (1, 2):
        us = timed(lambda: _barriers[(sms * per_sm,)](counter, counter[1:], 27))
        out["cells"][f"27 barriers, {per_sm}/SM"] = us
        print(f"27 grid barriers, {sms * per_sm} programs: {us:.1f} us ({us / 27:.2f} us each)", flush=True)
    for name, (B, T) in {"first call (2 x 40)": (2, 40), "steady, 32 streams (64 x 80)": (64, 80)}.items():
        x = torch.randn(B, T, 256, device=dev).to(torch.bfloat16)
        lengths = torch.full((B,), T, dtype=torch.int32, device=dev)
        normed = blocks[4].norm1(x)

        def per_block():
            h, n = x, normed
            for i in range(4, 8):
                last = i == 7
                o = blocks[i](h, n, lengths, 20, None, then=None if last else blocks[i + 1].norm1)
                h, n = (o, None) if last else o
            return h

        want = per_block()
        cells = {"per-block": timed(per_block)}
        for variant in args.variants.split(";"):
            kw = VARIANTS[variant]
            got = megakernel.run_blocks(blocks, 4, 4, x, normed, lengths, 20, **kw)
            err = float((got.float() - want.float()).norm() / want.float().norm())
            cells[variant] = timed(lambda: megakernel.run_blocks(blocks, 4, 4, x, normed, lengths, 20, **kw))
            out["cells"][f"{name} | {variant} | rel err"] = err
            print(f"{name:30s} {variant:24s} {cells[variant]:8.1f} us  rel err {err:.1e}", flush=True)
        empty = timed(lambda: megakernel.run_blocks(blocks, 4, 4, x, normed, lengths, 20, stages=(0, 0)))
        cells["empty launch"] = empty
        for k, kind in enumerate(KINDS):
            cells[f"stage {kind}"] = timed(lambda: megakernel.run_blocks(blocks, 4, 4, x, normed, lengths, 20,
                                                                         stages=(k, k + 1))) - empty
        for key, us in cells.items():
            out["cells"][f"{name} | {key}"] = us
        print(f"{name:30s} per-block {cells['per-block']:.1f} us; empty launch {empty:.1f} us; stages alone: " +
              ", ".join(f"{kind} {cells[f'stage {kind}']:.1f}" for kind in KINDS), flush=True)
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}")
    for key, v in out["cells"].items():
        print(f"{key:70s} {v:10.2f}" if "err" not in key else f"{key:70s} {v:10.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
