"""The estimator's products with their weights read before the launch wait (codec/prefetch_linear.py) against
cuBLAS's, alone and in a chain of transformer blocks as a flow call runs them. One run, one GPU:

    python bench/studies/prefetch_linear.py --json out.json

Products (bf16): q|k|v 256 → 768, the attention's output 256 → 256 with its bias, the feed-forward's 256 → 1024 with
its GELU (cuBLAS's column: fused_linear.py's kernel, as the estimator runs it) and 1024 → 256. Frames: a first call
of 1, 2 and 4 streams (80 a stream) and larger calls. "alone": one product replayed 50 times from one CUDA graph,
per op. "chain": 56 blocks of q|k|v, output, residual + norm3 (frame_ops.frame_norm), feed-forward, residual + the next
norm1, the 56 transformer blocks of one Euler step without their attention, in one CUDA graph, per block; every
Triton kernel launched with programmatic dependent launch, as in the vocoder. "folded": the same chain with the norms
and residuals inside the kernel's products (four kernels a block, not six), at the default tile.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
import torch.nn.functional as F
from torch import nn

from measure import gpu_record, graph_time, snr_db
from services.vocoder.codec import frame_ops, prefetch_linear
from services.vocoder.codec.fused_linear import linear_gelu

REPS = 50
BLOCKS = 56
FRAMES = (80, 160, 320, 640, 1280, 2560)
PRODUCTS = {"q|k|v": (256, 768, False, False), "output": (256, 256, True, False), "ff1 + GELU": (256, 1024, True, True),
            "ff2": (1024, 256, True, False)}
TILES = [None, (16, 32, 4), (32, 16, 4), (32, 64, 4), (64, 32, 4), (16, 16, 2)]


def cublas(x, w, b, gelu):
    return linear_gelu(x, w, b) if gelu else F.linear(x, w, b)


def tile_label(tile) -> str:
    return "default" if tile is None else "{}x{} w{}".format(*tile)


class Block(nn.Module):
    """A transformer block's products and per-frame kernels, without the attention (its output stands in for it)."""

    def __init__(self, gen, device):
        super().__init__()

        def w(n, k):
            return (torch.randn(n, k, generator=gen, device=device) / k ** 0.5).to(torch.bfloat16)

        self.qkv, self.out, self.ff1, self.ff2 = w(768, 256), w(256, 256), w(1024, 256), w(256, 1024)
        self.b_out, self.b_ff1, self.b_ff2 = (0.1 * torch.randn(n, generator=gen, device=device).to(torch.bfloat16)
                                              for n in (256, 1024, 256))
        self.norm3, self.norm1 = nn.LayerNorm(256).to(device, torch.bfloat16), nn.LayerNorm(256).to(device, torch.bfloat16)

    def forward(self, x, normed, product):
        qkv = product(normed, self.qkv, None, False)
        attended = product(qkv[..., 512:], self.out, self.b_out, False)         # v's columns: a [.., 256] view
        x, normed = frame_ops.frame_norm(attended, residual=x, then=self.norm3)
        h = product(normed, self.ff1, self.b_ff1, True)
        return frame_ops.frame_norm(product(h, self.ff2, self.b_ff2, False), residual=x, then=self.norm1)

    def folded(self, x):
        """The same block in four kernels, no per-frame kernel: norm1 inside q|k|v's product, the residual inside the
        output's, norm3 inside the feed-forward's first, the residual inside its second (estimator's `folded`)."""
        qkv = prefetch_linear.kernel(x, self.qkv, None, False, self.norm1)
        x = prefetch_linear.kernel(qkv[..., 512:], self.out, self.b_out, residual=x)
        h = prefetch_linear.kernel(x, self.ff1, self.b_ff1, True, self.norm3)
        return prefetch_linear.kernel(h, self.ff2, self.b_ff2, residual=x)


def chain(blocks, x, product):
    if product == "folded":
        for block in blocks:
            x = block.folded(x)
        return x
    normed = blocks[0].norm1(x)
    for block in blocks:
        x, normed = block(x, normed, product)
    return x


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--frames", default=",".join(map(str, FRAMES)))
    args = p.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    out = gpu_record()
    frames = [int(f) for f in args.frames.split(",")]
    rows = []
    for name, (K, N, has_bias, gelu) in PRODUCTS.items():
        w = (torch.randn(N, K, generator=gen, device=device) / K ** 0.5).to(torch.bfloat16)
        b = torch.randn(N, generator=gen, device=device).to(torch.bfloat16) if has_bias else None
        for M in frames:
            x = torch.randn(1, M, K, generator=gen, device=device).to(torch.bfloat16)
            want = cublas(x, w, b, gelu).float()
            cell = {"cublas_us": graph_time(lambda: cublas(x, w, b, gelu), REPS, 10, device) / REPS * 1e6, "tiles": {}}
            for tile in TILES:
                prefetch_linear.TILE = tile
                err = (prefetch_linear.kernel(x, w, b, gelu).float() - want).abs().max().item()
                us = graph_time(lambda: prefetch_linear.kernel(x, w, b, gelu), REPS, 10, device) / REPS * 1e6
                cell["tiles"][tile_label(tile)] = {"us": us, "max_err": err}
            prefetch_linear.TILE = None
            out["cells"][f"alone | {name} | {M}"] = cell
            best = min(cell["tiles"], key=lambda k: cell["tiles"][k]["us"])
            rows.append(("alone", name, M, cell["cublas_us"], cell["tiles"]["default"]["us"], best,
                         cell["tiles"][best]["us"], cell["tiles"]["default"]["max_err"]))
            print(*rows[-1], flush=True)
    blocks = [Block(gen, device) for _ in range(BLOCKS)]
    for M in frames:
        x = torch.randn(1, M, 256, generator=gen, device=device).to(torch.bfloat16)
        cell = {}
        base = chain(blocks, x, cublas).float()
        for label, tile in [("cublas", None), *[(tile_label(t), t) for t in TILES], ("folded", None)]:
            prefetch_linear.TILE = tile
            product = {"cublas": cublas, "folded": "folded"}.get(label, prefetch_linear.kernel)
            got = chain(blocks, x, product).float()
            us = graph_time(lambda: chain(blocks, x, product), 1, 20, device) / BLOCKS * 1e6
            cell[label] = {"us_per_block": us, "snr_db": snr_db(base, got)}
        prefetch_linear.TILE = None
        out["cells"][f"chain | {M}"] = cell
        best = min((k for k in cell if k not in ("cublas", "folded")), key=lambda k: cell[k]["us_per_block"])
        rows.append(("chain", "block", M, cell["cublas"]["us_per_block"], cell["default"]["us_per_block"], best,
                     cell[best]["us_per_block"], cell["default"]["snr_db"]))
        rows.append(("chain", "folded", M, cell["cublas"]["us_per_block"], cell["folded"]["us_per_block"], "default",
                     cell["folded"]["us_per_block"], cell["folded"]["snr_db"]))
        print(*rows[-2], flush=True)
        print(*rows[-1], flush=True)
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}: us per product (alone) or per block (chain)")
    print(f"{'how':6s} {'product':11s} {'frames':>6s} {'cuBLAS':>8s} {'kernel':>8s} {'ratio':>6s} {'best tile':>12s} "
          f"{'best':>8s} {'err / SNR':>9s}")
    for how, name, M, base_us, us, best, best_us, err in rows:
        print(f"{how:6s} {name:11s} {M:6d} {base_us:8.2f} {us:8.2f} {us / base_us:6.2f} {best:>12s} {best_us:8.2f} "
              f"{err:9.3g}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
