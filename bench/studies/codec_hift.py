"""HiFT as the vocoder runs it (real size, random weights, bf16, CUDA graphs), its Snake as PyTorch's ops against one
kernel (codec/snake.py), side by side in one run.

    python bench/studies/codec_hift.py --json out.json

Cells: one graph replay per (windows, mel frames) the stack's calls hold (a first chunk's window is 20 frames, bucket
24; the second's 40, bucket 48; the third's 63, bucket 64; a steady 20-token chunk's 103, bucket 128), a whole call of
the vocoder's mix of windows through the runner (its host work, every group's replay and the copy back), and a
stream's last window (43 frames: 19 of context, 4 held back, the flow's last 5 tokens): eager, as it ran before its
length had a graph, and replayed. Floor: the call's convolution multiply-adds over the card's bf16 matrix rate (its
memory traffic is smaller still: HiFT's activations are a few MB). Also the graphs' capture time.
"""

from __future__ import annotations

import argparse
import json
import time

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
from torch import nn

from measure import gpu_record, matmul_rate, median_time, snr_db, timed
from services.vocoder.codec import hift as hift_module
from services.vocoder.codec import snake
from services.vocoder.codec.config import moss_speech
from services.vocoder.codec.hift import HiFTGenerator
from services.vocoder.runner import GeneratorRunner

REPLAYS = [(1, 24), (1, 48), (1, 64), (1, 128), (4, 128), (16, 128)]
CALL_MIX = [20] * 3 + [40] * 3 + [63] * 3 + [103] * 6   # a call of 15 windows as the stack's bigger calls hold them
LAST = 43
CONDS = dict(cond_dtypes=(torch.float32, torch.long, torch.long, torch.long), cond_shapes=((9,), (), (), ()))


def conv_flops(model: nn.Module, frames: int, device) -> float:
    """Multiply-adds ×2 of every convolution and linear layer of one window of `frames` frames."""
    total = [0.0]

    def hook(m, inputs, out):
        if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)):
            cin = m.in_channels // m.groups
            k = m.kernel_size[0]
            n = out.numel() if isinstance(m, nn.Conv1d) else inputs[0].numel() * m.out_channels // m.in_channels
            total[0] += 2 * n * cin * k
        elif isinstance(m, nn.Linear):
            total[0] += 2 * out.numel() * m.in_features
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear))]
    with torch.inference_mode():
        model(*inputs_for(1, frames, device))
    for h in handles:
        h.remove()
    return total[0]


def inputs_for(batch: int, frames: int, device, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(batch * 1000 + frames)
    mel = (torch.randn(batch, 80, frames, generator=g) - 5).to(device, dtype)
    return (mel, torch.rand(batch, 9, generator=g).to(device), torch.full((batch,), 19, device=device),
            torch.full((batch,), frames - 4, device=device), torch.zeros(batch, dtype=torch.long, device=device))


def windows_for(lengths, device):
    g = torch.Generator().manual_seed(len(lengths))
    mels = [(torch.randn(80, n, generator=g) - 5).to(device) for n in lengths]
    conds = [(torch.rand(9, generator=g), torch.tensor(min(19, n - 4)), torch.tensor(n - 4), torch.tensor(48000 * i))
             for i, n in enumerate(lengths)]
    return mels, conds


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    device = torch.device("cuda")
    rate = matmul_rate()
    out = gpu_record(bf16_matmul_tflops=rate / 1e12)
    print(f"{out['gpu']}: bf16 matmul {rate / 1e12:.0f} TFLOP/s", flush=True)
    torch.manual_seed(0)
    weights = HiFTGenerator(moss_speech().hift).eval().state_dict()
    samples = {}
    for variant, act in (("ops", snake.reference), ("kernel", snake.kernel)):
        hift_module.snake = act   # every Snake's forward reads it
        model = HiFTGenerator(moss_speech().hift).eval()
        model.load_state_dict(weights)
        runner = GeneratorRunner(model, 480, device, fuse=False, channels_last=False, **CONDS)
        t = time.perf_counter()
        runner.warm_up((1, 4, 16), exact_frames=(LAST,), exact_batches=(1,))
        out[f"{variant}_graphs"] = {"count": len(runner.graphs), "seconds": time.perf_counter() - t}
        for batch, frames in REPLAYS:
            graph, static_in, _ = runner._graph(batch, frames)
            for static, x in zip(static_in, inputs_for(batch, frames, device)):
                static.copy_(x)
            ms = timed(graph.replay, args.reps) * 1e3
            floor = conv_flops(runner.generator, frames, device) * batch / rate * 1e3
            out["cells"][f"{variant} | replay {batch} x {frames}"] = {"ms": ms, "floor_ms": floor, "x_floor": ms / floor}
        mels, conds = windows_for(CALL_MIX, device)
        ms = median_time(lambda: runner(mels, [False] * len(mels), conds), args.reps, device) * 1e3
        floor = sum(conv_flops(runner.generator, n, device) for n in CALL_MIX) / rate * 1e3
        out["cells"][f"{variant} | a call of {len(CALL_MIX)} windows"] = {"ms": ms, "floor_ms": floor, "x_floor": ms / floor}
        samples[variant] = torch.cat([w for w, _ in runner(mels, [False] * len(mels), conds)])
        last, last_conds = windows_for([LAST], device)
        eager = GeneratorRunner(model, 480, device, fuse=False, channels_last=False, graphs=False, **CONDS)
        for kind, r in (("eager", eager), ("graph", runner)):
            ms = median_time(lambda r=r: r(last, [True], last_conds), args.reps, device) * 1e3
            out["cells"][f"{variant} | a last window ({LAST} frames), {kind}"] = {"ms": ms}
        runner = eager = model = None  # (freed before the next variant builds its own)
        torch.cuda.empty_cache()
    hift_module.snake = snake.snake
    out["kernel_vs_ops_snr_db"] = snr_db(samples["ops"], samples["kernel"])
    print(f"\nthe call's samples, kernel against ops: {out['kernel_vs_ops_snr_db']:.1f} dB SNR (bf16 either way)")
    for variant in ("ops", "kernel"):
        g = out[f"{variant}_graphs"]
        print(f"{variant}: {g['count']} graphs captured in {g['seconds']:.1f} s")
    print("\n| cell | Snake as ops | Snake as one kernel | floor |\n| --- | --- | --- | --- |")
    for name in [k.split(" | ", 1)[1] for k in out["cells"] if k.startswith("ops | ")]:
        a, b = out["cells"][f"ops | {name}"], out["cells"][f"kernel | {name}"]
        floor = f"{a['floor_ms']:.3f} ms" if "floor_ms" in a else "–"
        print(f"| {name} | {a['ms']:.2f} ms | {b['ms']:.2f} ms | {floor} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
