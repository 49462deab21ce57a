"""Where the flow decoder's time goes, and what compiling its estimator buys, on one GPU in one run.

    python bench/studies/codec_estimator.py --json out.json

The flow at the real size (random weights, bf16), as the vocoder calls it: one CUDA graph per (batch, token bucket)
over the encoder and the 10 Euler steps (each a CFG pair of rows through the estimator). Two shapes: a stream's first
block alone (prompt 40 + 8 tokens; its time is time to first audio) and a saturated call (16 streams, prompt 40 +
window 40 tokens; its time bounds the aggregate). Variants:
- before: the flow and estimator of an earlier commit (--before DIR: its estimator.py and flow.py, e.g.
  `git show REV:services/vocoder/codec/estimator.py`), to time a change against its parent on the same card;
- eager: today's modules, every prompt frame solved in every call;
Each variant's first block is also run once without a graph under the profiler, to count its kernels.
- prefix: today's with the voice's prompt prefix solved once (codec/prefix.py), in calls of every size (served:
  from decoder.PREFIX_MIN_ROWS rows on);
- compiled-dynamic / compiled-static: the estimator through torch.compile (one compilation for every shape, or
  one per shape).
Floors: the estimator's multiply-adds over the GPU's measured bf16 matrix rate. Also a profile of the first
variant's saturated call, by kernel.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch

from measure import gpu_record, matmul_rate, snr_db, timed
from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import moss_speech
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.flow_state import FlowState
from services.vocoder.codec.voice import random_voice


def before_flow(directory: str, cfg):
    """The flow class of an earlier commit (its estimator.py and flow.py in `directory`), with today's weights."""
    def load(name: str, file: str):
        spec = importlib.util.spec_from_file_location(name, Path(directory) / file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    load("before_estimator", "estimator.py")
    source = (Path(directory) / "flow.py").read_text().replace("services.vocoder.codec.estimator", "before_estimator")
    (Path(directory) / "before_flow.py").write_text(source)
    cls = load("before_flow", "before_flow.py").CausalMaskedDiffWithXvec
    forward = cls.forward
    cls.forward = lambda self, batch, streaming=True, prefix=None: forward(self, batch, streaming)  # today's call
    old = cls(cfg.flow).eval()
    old.load_state_dict(random_codec(cfg, 0)[0].state_dict())
    return old


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--streams", default="16", help="streams in the saturated calls, comma-separated (the first is profiled)")
    p.add_argument("--variants", default="eager,prefix")
    p.add_argument("--before", help="a directory with an earlier commit's estimator.py and flow.py (variant 'before')")
    args = p.parse_args()
    device = torch.device("cuda")
    cfg = moss_speech()
    voice = random_voice(cfg.flow, prompt_tokens=40, seed=3)
    g = torch.Generator().manual_seed(1)
    first = FlowState(voice, tuple(torch.randint(0, 16384, (8,), generator=g).tolist()), 0, 0)
    sizes = [int(n) for n in args.streams.split(",")]
    fulls = {n: [FlowState(voice, tuple(torch.randint(0, 16384, (40,), generator=g).tolist()), 0, 32) for _ in range(n)]
             for n in sizes}
    full = fulls[sizes[0]]
    shapes = {"first block (1 stream, 48 tokens)": [first]}
    shapes.update({f"saturated ({n} streams, 80 tokens)": states for n, states in fulls.items()})
    est_params = sum(p.numel() for p in random_codec(cfg, 0)[0].decoder.estimator.parameters())
    rate = matmul_rate()
    out = gpu_record(estimator_params=est_params, bf16_matmul_tflops=rate / 1e12)
    print(f"{out['gpu']}: bf16 matmul {rate / 1e12:.0f} TFLOP/s; estimator {est_params / 1e6:.1f}M parameters", flush=True)

    def frames_of(states, skipped):  # estimator frames a call computes: (prompt + window) tokens x 4, both CFG rows
        return sum((4 * (len(s.voice.prompt_tokens) + len(s.tokens)) - skipped) * 2 for s in states)

    reference, variants = {}, args.variants.split(",")
    for variant in variants:
        flow = before_flow(args.before, cfg) if variant == "before" else random_codec(cfg, 0)[0]
        if variant.startswith("compiled"):
            flow.decoder.estimator.compile(dynamic=variant == "compiled-dynamic", fullgraph=True)
        decoder = FlowTokenDecoder(flow, device, prefix_min_rows=1)
        if variant == "prefix":
            decoder.set_voices([voice])
        skipped = decoder.prefix.frames if decoder.prefix else 0
        for name, states in shapes.items():
            rows = [([], s) for s in states]
            t0 = time.perf_counter()
            mels = decoder.decode_chunks(rows)  # compiles (first use) and captures this shape's graph
            torch.cuda.synchronize()
            setup = time.perf_counter() - t0
            seconds = timed(lambda: decoder.decode_chunks(rows))
            mel = torch.cat([m for m, _ in mels], 1)
            reference.setdefault(name, mel)  # the first variant's
            floor = 2 * est_params * frames_of(states, skipped) * decoder.flow.decoder.n_timesteps / rate
            cell = {"ms": seconds * 1e3, "setup_s": setup, "floor_ms": floor * 1e3, "x_floor": seconds / floor,
                    "snr_vs_first_db": snr_db(reference[name], mel),
                    "audio_x_realtime": 0.4 * len(states) / seconds}
            out["cells"][f"{variant} | {name}"] = cell
            print(f"{variant:18s} {name:36s} {cell['ms']:8.2f} ms (floor {cell['floor_ms']:.2f}, {cell['x_floor']:.1f}x; "
                  f"{cell['audio_x_realtime']:.0f}x real time; first use {setup:.1f} s; SNR vs {variants[0]} "
                  f"{cell['snr_vs_first_db']:.1f} dB)", flush=True)
        decoder.use_graphs = False  # kernels per call: the first block's, counted by the profiler without a graph
        first_rows = [([], first)]
        decoder.decode_chunks(first_rows)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            decoder.decode_chunks(first_rows)
            torch.cuda.synchronize()
        kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        out[f"profile_first_{variant}"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12,
                                                                   max_name_column_width=60)
        out["cells"][f"{variant} | {next(iter(shapes))}"]["kernels"] = kernels
        print(f"{variant:18s} first block: {kernels} kernels a call", flush=True)
        if variant in ("eager", "prefix"):  # a profile of the saturated call, no graph
            rows = [([], s) for s in full]
            decoder.decode_chunks(rows)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                decoder.decode_chunks(rows)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60)
            out[f"profile_{variant}"] = table
            print(table, flush=True)
        decoder = flow = None  # (freed before the next variant builds its own)
        torch.cuda.empty_cache()

    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}")
    print(f"{'variant':18s} {'shape':36s} {'ms':>8s} {'floor':>7s} {'x floor':>7s} {'x RT':>6s} {'SNR dB':>7s} {'kernels':>8s}")
    for key, c in out["cells"].items():
        variant, name = key.split(" | ")
        print(f"{variant:18s} {name:36s} {c['ms']:8.2f} {c['floor_ms']:7.2f} {c['x_floor']:7.1f} "
              f"{c['audio_x_realtime']:6.0f} {c['snr_vs_first_db']:7.1f} {c.get('kernels', ''):>8}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
