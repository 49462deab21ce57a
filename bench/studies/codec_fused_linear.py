"""The feed-forward's first product with its GELU in one kernel (codec/fused_linear.py) against cuBLAS's product and
PyTorch's GELU, by tile, at the stack's call sizes. One run, one GPU:

    python bench/studies/codec_fused_linear.py --json out.json

256 → 1024 channels (bf16), the frames of steady calls of 1, 2, 6, 12 and 32 streams (2 CFG rows of 80 frames each).
Each cell is the op replayed 50 times from one CUDA graph, per op; `max err` is the largest difference from PyTorch's
(both bf16; PyTorch rounds the product, then the GELU).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
import torch.nn.functional as F
from codec_kernels import per_op

from measure import gpu_record
from services.vocoder.codec import fused_linear

STREAMS = (1, 2, 6, 12, 32)
TILES = [(64, 64, 4), (32, 64, 4), (16, 64, 4), (64, 128, 4), (32, 128, 4), (128, 64, 8), (128, 128, 8)]


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    out = gpu_record()
    weight = (0.06 * torch.randn(1024, 256, generator=gen, device=device)).to(torch.bfloat16)
    bias = torch.randn(1024, generator=gen, device=device).to(torch.bfloat16)
    rows = []
    for streams in STREAMS:
        M = 2 * streams * 80
        x = torch.randn(1, M, 256, generator=gen, device=device).to(torch.bfloat16)
        want = F.gelu(F.linear(x, weight, bias)).float()
        cell = {"frames": M, "pytorch_us": per_op(lambda: F.gelu(F.linear(x, weight, bias)), device) * 1e6,
                "default": list(fused_linear.tiles(M, 1024)), "tiles": {}}
        for tile in [None, *TILES]:
            fused_linear.TILE = tile
            label = "default" if tile is None else "{}x{} w{}".format(*tile)
            err = (fused_linear.kernel(x, weight, bias).float() - want).abs().max().item()
            cell["tiles"][label] = {"us": per_op(lambda: fused_linear.kernel(x, weight, bias), device) * 1e6,
                                    "max_err": err}
        fused_linear.TILE = None
        out["cells"][str(streams)] = cell
        best = min(cell["tiles"], key=lambda k: cell["tiles"][k]["us"])
        rows.append((streams, M, cell["pytorch_us"], cell["tiles"]["default"]["us"], best, cell["tiles"][best]["us"],
                     cell["tiles"]["default"]["max_err"]))
    print(f"{out['gpu']}, torch {out['torch']}, {out['date']}: us per op, replayed from a CUDA graph")
    print(f"{'streams':>7s} {'frames':>6s} {'cuBLAS+GELU':>11s} {'fused':>7s} {'ratio':>6s} {'best tile':>12s} "
          f"{'best':>6s} {'max err':>8s}")
    for streams, M, pytorch_us, fused_us, best, best_us, err in rows:
        print(f"{streams:7d} {M:6d} {pytorch_us:11.1f} {fused_us:7.1f} {fused_us / pytorch_us:6.2f} {best:>12s} "
              f"{best_us:6.1f} {err:8.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
