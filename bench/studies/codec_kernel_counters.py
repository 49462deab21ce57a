"""The flow's three costliest Triton kernels of a steady call at 32 streams, launched a few times for Nsight Compute
(ncu) to read their counters: the attention (codec_kernels.py's "history 32": 64 rows of 80 new frames after 140
prefix frames and a ring of 40) in its default tile, and in that tile rescaling every block (the default before
2026-12-02); frame_norm (5,120 frames of 256 channels: a norm, the
residual, then the next norm); the feed-forward's product with its GELU (5,120 x 256 → 1,024); and cuBLAS's product
of that shape for a reference.

Why: at 32 streams the attention takes 26.9 us against ~4 us of bytes, frame_norm 5.8 us against ~3, the product and
GELU 16.3 us against ~3.4 of FLOPs (docs/benchmarks.md, 2026-12-02); no tile, loop order or program shape moved them.
Their counters say what a program waits on (warp states), how busy the schedulers are, and how much of the memory
system each uses. On a GPU only, one kernel a process under ncu:

    for k in attention:_chunk_attention attention_every_block:_chunk_attention frame_norm:_frame_norm \
             linear_gelu:_linear_gelu "cublas:nvjet|gemm|xmma"; do
      ncu --clock-control none -k regex:"${k#*:}" --launch-skip 12 --launch-count 2 --set full \
        python3 bench/studies/codec_kernel_counters.py --only "${k%%:*}"
    done

The kernel `--only` names runs `--warm` times (compiles, then the launches ncu skips), then `--launches` more. Its
output is checked against PyTorch's form once before (one launch more), so the counters come from a right kernel.
"""

from __future__ import annotations

import argparse

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
import torch.nn.functional as F
from codec_kernels import inputs

from services.vocoder.codec import chunk_attention, frame_ops, fused_linear

FRAMES, CHANNELS, INNER = 5120, 256, 1024  # a steady call of 32 streams: 64 rows x 80 frames
EVERY_BLOCK_TILE = dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, PARTS=1)  # the small tile rescaling every block


def kernels(device: torch.device) -> dict:
    """Each kernel's launch and PyTorch's form of it, on the shapes of a steady call of 32 streams (bf16)."""
    gen, dtype, frames = torch.Generator(device).manual_seed(0), torch.bfloat16, FRAMES
    q, k, v, lengths, prefix, history = inputs("history 32", device, gen)
    h, res = (torch.randn(1, frames, CHANNELS, generator=gen, device=device).to(dtype) for _ in range(2))
    norm, then = (torch.nn.LayerNorm(CHANNELS, device=device, dtype=dtype) for _ in range(2))
    w = (torch.randn(INNER, CHANNELS, generator=gen, device=device) / CHANNELS ** 0.5).to(dtype)
    b = torch.randn(INNER, generator=gen, device=device).to(dtype)
    return {
        "attention": (lambda: chunk_attention.kernel(q, k, v, lengths, 20, prefix, None, history),
                      lambda: chunk_attention.reference(q, k, v, lengths, 20, prefix, history)),
        "attention_every_block": (lambda: chunk_attention.kernel(q, k, v, lengths, 20, prefix, EVERY_BLOCK_TILE, history),
                           lambda: chunk_attention.reference(q, k, v, lengths, 20, prefix, history)),
        "frame_norm": (lambda: frame_ops.kernel(h, norm, residual=res, then=then)[1],
                       lambda: frame_ops.reference(h, norm, residual=res, then=then)[1]),
        "linear_gelu": (lambda: fused_linear.kernel(h, w, b), lambda: F.gelu(F.linear(h, w, b))),
        "cublas": (lambda: F.linear(h, w, b), lambda: F.linear(h, w, b)),
    }


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warm", type=int, default=12, help="launches of each kernel before the counted ones")
    p.add_argument("--launches", type=int, default=4, help="launches of the kernel for ncu to read")
    p.add_argument("--only", required=True, choices=["attention", "attention_every_block", "frame_norm", "linear_gelu", "cublas"])
    args = p.parse_args()
    kernel, reference = kernels(torch.device("cuda"))[args.only]
    err = (kernel().float() - reference().float()).abs().max().item()
    print(f"{args.only}: max abs error against PyTorch's form {err:.2e}", flush=True)
    if err > 0.1:
        raise SystemExit(f"{args.only}: the kernel is wrong ({err:.3g}): no counters from it")
    for _ in range(args.warm + args.launches):
        kernel()
    torch.cuda.synchronize()
    print(f"{args.only}: launched {args.warm} + {args.launches} times")


if __name__ == "__main__":
    main()
