"""Where the flow's time goes, by kernel, with the defaults and with one of the flow's fused kernels off, on
one GPU in one run.

    python bench/studies/codec_flow_profile.py --streams 6,12 --json out.json

The flow at the real size (random weights, bf16), with each stream's history (codec/history.py), as the vocoder
calls it: a stream's first call (8 tokens; part of time to first audio) and a steady call of N streams (20 tokens
each). For each shape: its time in CUDA graphs, then one eager call under the profiler, by kernel (the table's
share of each kind of kernel says what to fuse next). Variants: `defaults`; `gelu-unfused` (the feed-forward's GELU
by PyTorch after cuBLAS's product, not in the product's kernel: fused_linear.FUSED off); `attention-one-walk` (each
attention program walks all of its keys, not in parts side by side: chunk_attention.SPLIT off);
`attention-large-tiles` (chunk_attention.SMALL_TILES_FROM 0); `attention-every-block` (the small tile's max
rescaled every block, and that tile from 32 streams only: chunk_attention's SMALL_TILE and SMALL_TILES_FROM before
2026-12-02); `norm-rows-N`, `norm-warps-N` and `norm-rows-4-warps-1` (frame_norm's frames and warps a program,
frame_ops.ROWS_PER_PROGRAM, which the causal unfold takes too, and NORM_WARPS); `no-pdl` (the Triton kernels launched
plainly, not with programmatic dependent launch: launch.ENABLED off); `unfolded` (the per-frame work apart
from the products where prefetch_linear's kernel runs: prefetch_linear.FOLD off). Their times, kernel counts, and
each mel's SNR against the first variant's. (Measured and not kept: the feed-forward's GELU as cuBLASLt's
epilogue, the tanh approximation where the reference's is exact; on 2026-11-27 the estimator's other products by
Triton's kernel too, so that every kernel of a transformer block launched early: no faster; on 2026-12-02 each
attention program's keys in one loop, 1.5x slower, and frame_norm at 4, 8 or 32 frames or 8 warps a program, within
±0.3 us a norm of the defaults' 5.8 us, 32 frames slower.)
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch

from measure import snr_db, timed
from services.common import launch
from services.vocoder.codec import chunk_attention, frame_ops, fused_linear, prefetch_linear
from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import moss_speech
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.voice import random_voice

# Each variant: the module settings it changes from the defaults (module, name, value)
SETTINGS = [(fused_linear, "FUSED"), (chunk_attention, "SPLIT"), (chunk_attention, "SMALL_TILES_FROM"),
            (chunk_attention, "SMALL_TILE"), (launch, "ENABLED"), (prefetch_linear, "FOLD"),
            (frame_ops, "ROWS_PER_PROGRAM"), (frame_ops, "NORM_WARPS")]
DEFAULTS = {name: getattr(module, name) for module, name in SETTINGS}
VARIANTS = {"defaults": {}, "gelu-unfused": {"FUSED": False}, "attention-one-walk": {"SPLIT": False},
            "attention-large-tiles": {"SMALL_TILES_FROM": 0}, "attention-every-block": {"SMALL_TILES_FROM": 512,
                                      "SMALL_TILE": dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, LAZY=False)},
            "norm-rows-4": {"ROWS_PER_PROGRAM": 4}, "norm-rows-8": {"ROWS_PER_PROGRAM": 8}, "norm-rows-32": {"ROWS_PER_PROGRAM": 32},
            "norm-warps-2": {"NORM_WARPS": 2}, "norm-warps-8": {"NORM_WARPS": 8},
            "norm-rows-4-warps-1": {"ROWS_PER_PROGRAM": 4, "NORM_WARPS": 1}, "no-pdl": {"ENABLED": False}, "unfolded": {"FOLD": False}}


def use(variant: str) -> None:
    """Set the modules' settings to `variant`'s (the defaults for the rest)."""
    values = {**DEFAULTS, **VARIANTS[variant]}
    for module, name in SETTINGS:
        setattr(module, name, values[name])
WARM_CHUNKS = (8, 5, 10, 20)   # the gateway's schedule up to the steady state
CHUNK = 20


def steady_rows(d: FlowTokenDecoder, voice, tokens: list[list[int]]) -> list[tuple]:
    """Streams of `tokens` (each at least sum(WARM_CHUNKS) + CHUNK long) decoded through the gateway's schedule up
    to the steady state → each stream's next window: [(its next CHUNK tokens, its state)]."""
    states, at = [d.start(voice) for _ in tokens], 0
    for c in WARM_CHUNKS:
        states = [s for _, s in d.decode_chunks([(t[at : at + c], s) for t, s in zip(tokens, states)])]
        at += c
    return [(t[at : at + CHUNK], s) for t, s in zip(tokens, states)]


def profile_table(fn) -> tuple[str, int, float]:
    """One eager call under the profiler → (its kernels by CUDA time, top 15; kernel count; CUDA ms)."""
    cuda = torch.cuda.is_available()
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.self_device_time_total for e in kernels) / 1e3
    table = events.table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60)
    return table, sum(e.count for e in kernels), total


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--streams", default="6", help="steady calls of these many streams (comma-separated)")
    p.add_argument("--variants", default="defaults,attention-one-walk", help=f"of {', '.join(VARIANTS)}, in this "
                   "order (a second decoder's first call measured slower, whichever its variant: run both orders)")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (no kernels to profile)")
    args = p.parse_args()
    device, cfg = torch.device(args.device), moss_speech()
    voice = random_voice(cfg.flow, prompt_tokens=40, seed=3)
    g = torch.Generator().manual_seed(1)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": gpu,
           "torch": torch.__version__, "cells": {}, "profiles": {}}
    counts = [int(n) for n in args.streams.split(",")]
    tokens = torch.randint(0, cfg.flow.vocab_size, (max(counts), sum(WARM_CHUNKS) + CHUNK), generator=g).tolist()
    mels = {}
    seen: dict[str, int] = {}
    for variant in args.variants.split(","):
        use(variant)
        seen[variant] = seen.get(variant, 0) + 1
        name = variant if seen[variant] == 1 else f"{variant} ({seen[variant]})"  # a variant again: the order's effect
        d = FlowTokenDecoder(random_codec(cfg, 0)[0], device, history_streams=sum(counts) + 1)  # (a history slot each)
        d.set_voices([voice])
        shapes = {"first call, 1 stream": [(tokens[0][:8], d.start(voice))]}
        for n in counts:
            shapes[f"steady call, {n} streams"] = steady_rows(d, voice, tokens[:n])
        for shape, rows in shapes.items():
            result = d.decode_chunks(rows)  # captures the shape's graph
            seconds = timed(lambda: d.decode_chunks(rows), 10)
            mel = torch.cat([m for m, _ in result], 1).float()
            mels.setdefault(shape, mel)
            cell = {"ms": seconds * 1e3, "snr_vs_first_db": snr_db(mels[shape], mel)}
            out["cells"][f"{name} | {shape}"] = cell
            print(f"{name:22s} {shape:24s} {cell['ms']:7.2f} ms  SNR vs the first variant {cell['snr_vs_first_db']:.1f} dB", flush=True)
            graphs, d.use_graphs = d.use_graphs, False
            table, count, total = profile_table(lambda: d.decode_chunks(rows))
            d.use_graphs = graphs
            out["profiles"][f"{name} | {shape}"] = {"kernels": count, "cuda_ms_eager": total, "table": table}
            print(f"eager: {count} kernels, {total:.2f} ms of kernel time\n{table}", flush=True)
        d = None
        torch.cuda.empty_cache()
    use("defaults")
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}")
    print(f"{'variant':22s} {'shape':24s} {'graph ms':>8s} {'kernels':>8s} {'SNR dB':>7s}")
    for key, c in out["cells"].items():
        variant, shape = key.split(" | ")
        print(f"{variant:22s} {shape:24s} {c['ms']:8.2f} {out['profiles'][key]['kernels']:8d} {c['snr_vs_first_db']:7.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
