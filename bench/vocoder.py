"""Vocoder benchmark: the `bigvgan` package's eager generator against ours (runner.py: bf16, fused
anti-aliased activation, CUDA graphs per (batch, frames) bucket), on one GPU, in one run, random weights.

    python bench/vocoder.py --device cuda --json out.json

For each config (the 24 kHz / 80-band / hop-480 preset; the published v2 22 kHz / 80-band / hop-256
layout):
- first chunk at batch 1: a stream's first window of 2 and of 3 tokens (80 ms each: 4 frames per token at
  hop 480, 7 at hop 256 rounded up), mel on the GPU → samples on the host, median of --reps;
- aggregate speed at 8, 32, 64 and 128 streams: each stream's steady-state window (--chunk-tokens tokens
  plus the streamer's default context: the whole left receptive field and 4 frames of lookahead),
  all streams' windows vocoded together (the package batched too, one padded batch: its best case);
  seconds of audio kept per second of wall time.
- quality: our bf16 output against the package's float32 output for the same window (SNR, dB).
Targets: first chunk of 2 tokens ≤ 3 ms; ≥ 2x the package at 32 streams; ≥ 250x real time at 64.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import statistics
import time
import warnings

import torch

from measure import snr_db, sync, times
from services.vocoder import generator as gen
from services.vocoder.receptive_field import receptive_field
from services.vocoder.runner import GeneratorRunner
from services.vocoder.streamer import DEFAULT_LOOKAHEAD

CONFIGS = {"24k-80band-480x": "moss-speech", "22k-80band-256x": "bigvgan-v2-22khz-80band-256x", "tiny": "tiny"}
TOKEN_SECONDS = 0.08
MIXED_SCHEDULE = (3, 3, 6, 12, 20, 20, 11)  # a 75-token stream's chunks (the gateway's schedule), --mixed


def package_model(h, device):
    import bigvgan

    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        model = bigvgan.BigVGAN(h, use_cuda_kernel=False)
        model.remove_weight_norm()
    return model.eval().to(device)


def kernel_profile(title: str, fn, device) -> None:
    """Print the CUDA kernels of one call of fn, most time first."""
    if device.type != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    busy = sum(e.device_time_total for e in kernels) / 1e3
    print(f"{title}: {len(kernels)} kernels, {busy:.2f} ms of kernel time")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


@torch.inference_mode()
def bench_config(name: str, preset: str, args, device) -> dict:
    h = gen.preset_config(preset)
    hop, sr = math.prod(h["upsample_rates"]), h["sampling_rate"]
    frames_per_token = math.ceil(TOKEN_SECONDS * sr / hop)
    left, _ = receptive_field(h)
    theirs = package_model(h, device)
    ours = GeneratorRunner(gen.build_generator(h, seed=0), hop, device)
    # --compare-layout: ours again with [B, C, T] activations (no channels_last.py), to see what the layout buys
    flat = GeneratorRunner(gen.build_generator(h, seed=0), hop, device, channels_last=False) \
        if args.compare_layout else None
    t = time.perf_counter()
    ours.warm_up((1,))
    out = {"hop": hop, "sampling_rate": sr, "frames_per_token": frames_per_token, "receptive_field_left": left,
           "fused_activations": ours.fused, "dtype": str(ours.dtype), "warm_up_s": time.perf_counter() - t,
           "first_chunk": {}, "streams": {}}
    g = torch.Generator(device="cpu").manual_seed(1)

    for tokens in (2, 3):  # a stream's first window: no left context yet, lookahead held back but computed
        frames = tokens * frames_per_token
        mel = (torch.randn(h["num_mels"], frames, generator=g) - 5).to(device)
        pkg = times(lambda: theirs(mel[None])[0, 0].cpu(), args.reps, device)
        our = times(lambda: ours([mel]), args.reps, device)
        ref = theirs(mel[None])[0, 0, : frames * hop].float().cpu()
        mine = ours([mel], [True])[0]
        cell = {}
        if flat is not None:
            cell["ours_bct_layout_ms"] = statistics.median(times(lambda: flat([mel]), args.reps, device)) * 1e3
        if args.profile and tokens == 2:
            kernel_profile(f"[{name}] one 2-token first chunk", lambda: ours([mel]), device)
        out["first_chunk"][tokens] = {**cell, "frames": frames, "package_ms": statistics.median(pkg) * 1e3,
                                      "ours_ms": statistics.median(our) * 1e3, "snr_bf16_vs_fp32_db": snr_db(ref, mine)}
        print(f"[{name}] first chunk {tokens} tokens ({frames} frames): package {out['first_chunk'][tokens]['package_ms']:.2f} ms, "
              f"ours {out['first_chunk'][tokens]['ours_ms']:.2f} ms, SNR ours(bf16) vs package(fp32) "
              f"{out['first_chunk'][tokens]['snr_bf16_vs_fp32_db']:.1f} dB"
              + (f"; [B, C, T] layout {cell['ours_bct_layout_ms']:.2f} ms" if cell else ""), flush=True)

    new = args.chunk_tokens * frames_per_token
    window = left + new + DEFAULT_LOOKAHEAD
    for streams in (int(s) for s in args.streams.split(",")):
        mels = [(torch.randn(h["num_mels"], window, generator=g) - 5).to(device) for _ in range(streams)]
        batch = torch.stack(mels)
        audio = streams * new * hop / sr
        pkg = times(lambda: theirs(batch)[:, 0].cpu(), max(3, args.reps // 4), device)
        our = times(lambda: ours(mels), max(3, args.reps // 4), device)
        if args.profile and streams == 64:
            kernel_profile(f"[{name}] one call of 64 streams", lambda: ours(mels), device)
        cell = {"window_frames": window, "kept_frames": new, "audio_s_per_call": audio,
                "package_x_realtime": audio / statistics.median(pkg), "ours_x_realtime": audio / statistics.median(our)}
        if args.mixed:  # streams out of phase: one call holds windows of every chunk size of the schedule
            sizes = [MIXED_SCHEDULE[i % len(MIXED_SCHEDULE)] for i in range(streams)]
            mixed = [(torch.randn(h["num_mels"], (left if i % len(MIXED_SCHEDULE) else 0) + n * frames_per_token
                                  + DEFAULT_LOOKAHEAD, generator=g) - 5).to(device) for i, n in enumerate(sizes)]
            mixed_audio = sum(sizes) * frames_per_token * hop / sr
            cell["mixed_x_realtime"] = mixed_audio / statistics.median(times(lambda: ours(mixed), max(3, args.reps // 4), device))
            print(f"[{name}] {streams} streams, mixed chunk sizes {MIXED_SCHEDULE}: ours {cell['mixed_x_realtime']:.0f}x real time")
        if flat is not None:
            cell["ours_bct_layout_x_realtime"] = audio / statistics.median(times(lambda: flat(mels), max(3, args.reps // 4), device))
        out["streams"][streams] = cell
        print(f"[{name}] {streams} streams ({window}-frame windows, {new} kept): package {cell['package_x_realtime']:.0f}x "
              f"real time, ours {cell['ours_x_realtime']:.0f}x ({cell['ours_x_realtime'] / cell['package_x_realtime']:.1f}x)"
              + (f"; [B, C, T] layout {cell['ours_bct_layout_x_realtime']:.0f}x" if flat is not None else ""), flush=True)
    theirs = ours = flat = None  # freed before what comes next
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--configs", default="24k-80band-480x,22k-80band-256x", help=f"of {', '.join(CONFIGS)}")
    p.add_argument("--streams", default="8,32,64,128")
    p.add_argument("--chunk-tokens", type=int, default=20, help="tokens per later chunk (the largest, the default chunk_tokens)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--mixed", action="store_true",
                   help="also time calls whose windows cycle through every chunk size of a stream (streams out of phase)")
    p.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per shape")
    p.add_argument("--profile", action="store_true",
                   help="print the kernels of one first chunk (2 tokens) and of one call of 64 streams")
    p.add_argument("--compare-layout", action="store_true",
                   help="also time ours with [B, C, T] activations (without channels_last.py)")
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__,
              "cudnn_benchmark": args.cudnn_benchmark,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "configs": {}}
    for name in args.configs.split(","):
        result["configs"][name] = bench_config(name, CONFIGS[name], args, device)
    print(f"\n{result['gpu']}, torch {result['torch']}, {result['date']}")
    print(f"{'config':18s} {'cell':22s} {'package':>10s} {'ours':>10s} {'ratio':>7s}")
    for name, r in result["configs"].items():
        for tokens, c in r["first_chunk"].items():
            print(f"{name:18s} {f'first chunk {tokens} tok':22s} {c['package_ms']:8.2f}ms {c['ours_ms']:8.2f}ms "
                  f"{c['package_ms'] / c['ours_ms']:6.1f}x")
        for streams, c in r["streams"].items():
            print(f"{name:18s} {f'{streams} streams':22s} {c['package_x_realtime']:8.0f}xRT {c['ours_x_realtime']:8.0f}xRT "
                  f"{c['ours_x_realtime'] / c['package_x_realtime']:6.1f}x")
    main_cfg = result["configs"].get("24k-80band-480x")
    if main_cfg:
        fc = main_cfg["first_chunk"].get(2)
        s32, s64 = main_cfg["streams"].get(32), main_cfg["streams"].get(64)
        print("targets (24k-80band-480x):")
        if fc:
            print(f"  {'PASS' if fc['ours_ms'] <= 3 else 'MISS'} first chunk of 2 tokens <= 3 ms: {fc['ours_ms']:.2f} ms")
        if s32:
            r = s32["ours_x_realtime"] / s32["package_x_realtime"]
            print(f"  {'PASS' if r >= 2 else 'MISS'} >= 2x the package at 32 streams: {r:.1f}x")
        if s64:
            print(f"  {'PASS' if s64['ours_x_realtime'] >= 250 else 'MISS'} >= 250x real time at 64 streams: "
                  f"{s64['ours_x_realtime']:.0f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
