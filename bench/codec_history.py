"""What keeping each stream's solved frames buys the flow (codec/history.py), on one GPU in one run.

    python bench/codec_history.py --streams 1,16,32,64 --json out.json

The flow at the real size (random weights, bf16, CUDA graphs), as the vocoder calls it, two ways side by side:
- window: every call solves the stream's latest 40 tokens again (the reference's streaming, with the voice prefix
  solved once: prefix.py);
- history: every call solves the stream's new frames only, reading its kept frames.
Shapes: a stream's first call (8 tokens: the first block and its look-ahead; its time is part of time to first
audio), and calls in the steady state of 20-token chunks (after 8, 8, 16: each stream brings 20 tokens,
4 blocks, 1.6 s of audio) for N streams at once. x RT: seconds of audio the call makes per second. Floor: the
estimator's multiply-adds for the frames the call solves over the card's measured bf16 matrix rate.

Variants (--variants): `prefetch`, the estimator's products up to prefetch_linear.MAX_ROWS frames with their
weights read before the launch wait, and there each transformer block in five kernels, its norms, residuals and kept
keys inside its products, and each causal convolution's product reading its taps (the default); `prefetch-apart`, the
same products with the block's seven kernels and causal_unfold's (prefetch_linear.FOLD off); `prefetch-all`, the
kernel at every size (folded where it runs); `per-block`, the seven kernels with cuBLAS's products at every size;
`megakernel`, a U-Net level's blocks in one persistent launch (codec/megakernel.py, off by default: slower); `no-cascade`, the per-block
path with every row reading its voice prefix itself (chunk_attention.CASCADE_FROM = 0; today's default), and `cascade`,
the voice prefix read once per voice from 16 streams (off by default: slower); `encoder-state`, the per-block path with
the encoder run over each call's new tokens only (--flow-encoder-window 128; codec/encoder_state.py). --kernels: each
cell's kernels, counted by the profiler on one call run without its CUDA graph (the same kernels the graph holds), and
per Euler step. --beside-llm: each cell timed again while the llm decodes beside it as in the stack (this process and
an llm child clients of one MPS daemon, the llm's share 25%: 64 sequences at context 512, steps back to back:
bench/studies/gpu_sharing.py's child), with the llm's step time meanwhile against its own alone.

    python bench/codec_history.py --streams 1,16,32 --modes history --kernels --beside-llm

    python bench/codec_history.py --streams 1,16,32 --modes history --variants per-block,megakernel --kernels
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from measure import gpu_record, matmul_rate, snr_db, timed
from services.vocoder.codec import chunk_attention, megakernel, prefetch_linear
from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import moss_speech
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.voice import random_voice

WARM_CHUNKS = (8, 8, 16, 20)   # up to the steady state (the gateway's schedule when measured; now 8, 5, 10, 20)
CHUNK = 20
ENCODER_WINDOW = 128  # the `encoder-state` variant's: kept positions a call's encoder reads (codec/encoder_state.py)
CASCADE_FROM = 256  # the `cascade` variant's: rows x heads (16 streams) from which the prefix is read once per voice


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--streams", default="1,16,32,64")
    p.add_argument("--modes", default="window,history", help="window, history or both")
    p.add_argument("--variants", default="prefetch",
                   help="prefetch, prefetch-apart, prefetch-all, per-block, cascade, no-cascade, megakernel, "
                        "encoder-state: one or more")
    p.add_argument("--kernels", action="store_true", help="count each cell's kernels with the profiler")
    p.add_argument("--beside-llm", action="store_true", help="time each cell again beside the llm's decode steps "
                   "(under an MPS daemon of this run's own, the llm at 25%%)")
    args = p.parse_args()
    with contextlib.ExitStack() as stack:
        llm = stack.enter_context(BesideLlm()) if args.beside_llm else None  # (before this process touches CUDA)
        run(args, llm)


def run(args, llm: BesideLlm | None) -> None:
    sizes = [int(n) for n in args.streams.split(",")]
    device, cfg = torch.device("cuda"), moss_speech()
    voice = random_voice(cfg.flow, prompt_tokens=40, seed=3)
    g = torch.Generator().manual_seed(1)
    est_params = sum(p.numel() for p in random_codec(cfg, 0)[0].decoder.estimator.parameters())
    rate = matmul_rate()
    out = gpu_record(bf16_matmul_tflops=rate / 1e12)
    print(f"{out['gpu']}: bf16 matmul {rate / 1e12:.0f} TFLOP/s", flush=True)
    if llm is not None:
        out["llm_alone_ms"] = llm.alone_ms()
        print(f"the llm's decode step alone (64 sequences, context 512, 25% of the GPU): {out['llm_alone_ms']:.2f} ms",
              flush=True)
    tokens = torch.randint(0, 16384, (max(sizes), sum(WARM_CHUNKS) + CHUNK), generator=g).tolist()
    mels, cascade_from, max_rows = {}, chunk_attention.CASCADE_FROM, prefetch_linear.MAX_ROWS
    variants = args.variants.split(",")
    # a variant named twice (to run it in both orders: a second decoder's first call measures slower) is labelled
    # by its run, `per-block.1`, `per-block.2`
    labels = [v if variants.count(v) == 1 else f"{v}.{variants[:i + 1].count(v)}" for i, v in enumerate(variants)]
    for label, variant, mode in [(lb, v, m) for lb, v in zip(labels, variants) for m in args.modes.split(",")]:
        megakernel.ENABLED = variant == "megakernel"
        prefetch_linear.ENABLED = variant != "per-block"
        prefetch_linear.MAX_ROWS = 1 << 30 if variant == "prefetch-all" else max_rows
        prefetch_linear.FOLD = variant != "prefetch-apart"
        chunk_attention.CASCADE_FROM = {"no-cascade": 0, "cascade": CASCADE_FROM}.get(variant, cascade_from)
        d = FlowTokenDecoder(random_codec(cfg, 0)[0], device, history_streams=max(sizes) if mode == "history" else 0,
                             encoder_window=ENCODER_WINDOW if variant == "encoder-state" else 0)
        d.set_voices([voice])
        free, _ = torch.cuda.mem_get_info()
        out[f"{mode}_free_gib"] = free / 2**30
        for n in sizes:
            states = [d.start(voice) for _ in range(n)]
            first = [(tokens[i][:8], s) for i, s in enumerate(states)]
            cells = {"first call": first}
            at = 0
            for c in WARM_CHUNKS:                  # to the steady state
                states = [s for _, s in d.decode_chunks([(tokens[i][at : at + c], s) for i, s in enumerate(states)])]
                at += c
            cells["steady call"] = [(tokens[i][at : at + CHUNK], s) for i, s in enumerate(states)]
            for shape, rows in cells.items():
                result = d.decode_chunks(rows)     # captures the shape's graph
                seconds = timed(lambda: d.decode_chunks(rows), 10)
                mel = torch.cat([m for m, _ in result], 1)
                frames = sum(m.shape[1] for m, _ in result)
                solved = solved_frames(d, rows, mode)
                floor = 2 * est_params * 2 * solved * d.flow.decoder.n_timesteps / rate
                mels.setdefault((n, shape), mel)
                cell = {"variant": variant, "ms": seconds * 1e3, "audio_s": frames / 50,
                        "x_realtime": frames / 50 / seconds, "solved_frames": solved, "floor_ms": floor * 1e3,
                        "x_floor": seconds / floor, "snr_vs_first_db": snr_db(mels[(n, shape)], mel)}
                if args.kernels:
                    cell["kernels"] = count_kernels(d, rows)
                    cell["kernels_per_step"] = cell["kernels"] / d.flow.decoder.n_timesteps
                if llm is not None:
                    beside, llm_ms = llm.beside(lambda: timed(lambda: d.decode_chunks(rows), 10))
                    cell.update(beside_llm_ms=beside * 1e3, x_floor_beside_llm=beside / floor, llm_step_ms=llm_ms)
                out["cells"][f"{label} | {mode} | {n} | {shape}"] = cell
                print(f"{label:10s} {mode:8s} {n:3d} streams {shape:12s} {cell['ms']:7.2f} ms  "
                      f"{cell['x_realtime']:6.0f}x RT  solved {solved:6d} frames  {cell['x_floor']:5.1f}x floor  "
                      f"{cell.get('kernels', '-')} kernels  SNR vs the first cell {cell['snr_vs_first_db']:.1f} dB",
                      flush=True)
            if d.history is not None:
                for s in states:
                    d.history.release(s.stream)
        d = None
        torch.cuda.empty_cache()
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}")
    beside = f" {'beside llm':>10s} {'x floor':>7s} {'llm step':>8s}" if llm is not None else ""
    print(f"{'variant':10s} {'mode':8s} {'streams':>7s} {'shape':12s} {'ms':>8s} {'x RT':>6s} {'frames':>7s} "
          f"{'floor ms':>8s} {'x floor':>7s} {'kernels/step':>12s} {'SNR dB':>7s}{beside}")
    for key, c in out["cells"].items():
        variant, mode, n, shape = key.split(" | ")
        per_step = f"{c['kernels_per_step']:.0f}" if "kernels_per_step" in c else "-"
        beside = (f" {c['beside_llm_ms']:10.2f} {c['x_floor_beside_llm']:7.1f} {c['llm_step_ms']:8.2f}"
                  if "beside_llm_ms" in c else "")
        print(f"{variant:10s} {mode:8s} {n:>7s} {shape:12s} {c['ms']:8.2f} {c['x_realtime']:6.0f} {c['solved_frames']:7d} "
              f"{c['floor_ms']:8.2f} {c['x_floor']:7.1f} {per_step:>12s} {c['snr_vs_first_db']:7.1f}{beside}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


class BesideLlm:
    """The llm decoding beside this process as in the stack: an MPS daemon of its own, this process a client of it
    (entered before this process touches CUDA), and an llm child at 25% of the GPU (gpu_sharing.py's: 64 sequences
    at context 512, steps back to back, its products checked)."""

    SECONDS = 4.0  # each run of the llm's loop: longer than the calls timed beside it

    def __enter__(self) -> BesideLlm:
        import sys
        from types import SimpleNamespace

        from services.mps import MpsDaemon

        sys.path.insert(0, str(Path(__file__).resolve().parent / "studies"))
        from gpu_sharing import Child

        self.daemon = MpsDaemon().__enter__()
        os.environ.update(self.daemon.env())
        args = SimpleNamespace(size="real", device="cuda", batch=64, context=512, windows=1, seconds=self.SECONDS,
                               kv_gb=8.0, quantization="none", flow_variant="defaults", llm_pdl="on")
        self.child = Child("llm", args, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
        return self

    def alone_ms(self) -> float:
        return self.child.ask("llm")[0]["ms"]

    def beside(self, timing):
        """timing() run while the llm's loop runs → (what it returned, the llm's ms a step meanwhile)."""
        self.child.send("ready")
        self.child.read()  # {"prepared": "llm"}: its sequences decoding
        self.child.send("go")
        time.sleep(0.3)    # (its steps under way)
        result = timing()
        return result, self.child.read()["results"][0]["ms"]

    def __exit__(self, *exc) -> None:
        self.child.close()
        self.daemon.__exit__(*exc)


def count_kernels(d: FlowTokenDecoder, rows) -> int:
    """The kernels of one call of these rows, run eagerly under the profiler (the kernels its graph replays)."""
    from torch.profiler import ProfilerActivity, profile

    graphs, d.use_graphs = d.use_graphs, False
    try:
        d.decode_chunks(rows)                      # (eager shapes' first run: choices made, kernels compiled)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            d.decode_chunks(rows)
            torch.cuda.synchronize()
    finally:
        d.use_graphs = graphs
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
               and "memset" not in e.name.lower())


def solved_frames(d: FlowTokenDecoder, rows, mode: str) -> int:
    """Frames the estimator solves for these rows (one CFG half), before padding to buckets."""
    total = 0
    for tokens, state in rows:
        state = dataclasses.replace(state, tokens=state.tokens + tuple(tokens))
        plan = d.plan(state, state.received, False)
        if plan is None:
            continue
        prompt = len(state.voice.prompt_tokens)
        if mode == "history":
            total += d._tail_frames(state) + (plan.decode_end - plan.emit_from) * d.ratio
        else:
            total += (prompt + plan.decode_end - plan.start) * d.ratio - d.prefix.frames
    return total


if __name__ == "__main__":
    main()
