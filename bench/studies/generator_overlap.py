"""The playing streams' calls one after another (VocoderWorker) against pipelined (PipelinedWorker: each call's
generator, HiFT, on a CUDA stream of its own beside the next call's flow), in one run: the codec's flow and HiFT at the
real size (random weights, bf16, CUDA graphs), alone and, with --beside-llm, beside the llm's decode as in the stack
(bench/codec_history.py's: an MPS daemon of this run's own, the llm at 25%: 64 sequences at context 512).

Each of --streams streams hands in its next chunk of 20 tokens as soon as its last one's samples are back (an llm that
is never late; 8, 5 and 10 tokens first, not timed). A call holds at most half the streams (--max-batch) and the flow's
mel frames (worker.FLOW_LIMITS; its first runs, on 2026-12-02, took the stand-in's 1,024: calls of 9 windows), so calls
take turns between two groups, as the stack's playing calls hold about half its streams (docs/benchmarks.md,
loads-2026-12-02): a call's generator then has the other group's flow to run beside. Each worker runs --seconds, twice
in the order serial, pipelined, serial, pipelined (one decoder: the profile's later-decoder bias stays out of it).
Prints, per run: windows a second, audio a second (x real time), calls a second, their mean windows, a window's time
in its call (mean and p95: in the stack, a second chunk's), and the pipelined runs' ratio to the serial ones; writes
JSON.

    python bench/studies/generator_overlap.py --streams 32,64 --beside-llm --json out.json
    python bench/studies/generator_overlap.py --preset tiny-codec --device cpu --streams 4 --seconds 1   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import numpy as np
import torch

from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.pipelined_worker import PipelinedWorker
from services.vocoder.streamer import MelStreamer
from services.vocoder.worker import FLOW_LIMITS, Job, VocoderWorker

FIRST_CHUNKS = (8, 5, 10)  # the gateway's first chunks (services/common/sampling.py), then CHUNK each
CHUNK = 20
KINDS = {"serial": VocoderWorker, "pipelined": PipelinedWorker}


class Feed:
    """Streams that hand in their next chunk the moment the last one's samples are back, while `on` is set."""

    def __init__(self, worker, vocoder, streams: int, seed: int):
        self.worker, self.vocoder = worker, vocoder
        self.rng = np.random.default_rng(seed)
        self.streamers = [MelStreamer(vocoder) for _ in range(streams)]
        self.sent = [0] * streams           # chunks handed in
        self.audio = [0.0] * streams        # seconds of audio back
        self.started: list[float | None] = [None] * streams
        self.on, self.lock = True, threading.Lock()
        self.done: list[tuple[float, int, float]] = []  # (when, windows' samples, seconds)
        self.outstanding = 0
        self.idle = threading.Event()

    def start(self) -> None:
        for i in range(len(self.streamers)):
            self._next(i)

    def _next(self, i: int) -> None:
        k = self.sent[i]
        n = FIRST_CHUNKS[k] if k < len(FIRST_CHUNKS) else CHUNK
        tokens = self.rng.integers(0, self.vocoder.codebook_size, n).tolist()
        with self.lock:
            self.sent[i] += 1
            self.outstanding += 1
            self.idle.clear()
        future = self.worker.submit(Job(self.streamers[i], tokens, self.started[i], self.audio[i]))
        future.add_done_callback(lambda f, i=i: self._back(i, f))

    def _back(self, i: int, future) -> None:
        seconds = len(future.result().samples) / self.vocoder.sample_rate
        now = time.perf_counter()
        with self.lock:
            self.outstanding -= 1
            self.done.append((now, i, seconds))
            if self.started[i] is None:
                self.started[i] = now
            self.audio[i] += seconds
            go = self.on
            if not go and not self.outstanding:
                self.idle.set()
        if go:
            self._next(i)

    def stop(self) -> None:
        with self.lock:
            self.on = False
            if not self.outstanding:
                self.idle.set()
        self.idle.wait(60)

    def warmed(self) -> bool:
        return min(self.sent) > len(FIRST_CHUNKS) + 1


def run(vocoder, kind: str, streams: int, max_batch: int, seconds: float, seed: int, calls: list) -> dict:
    """One worker of `kind` fed by `streams` streams: its windows and audio a second over `seconds`."""
    vocoder.runner.stream = None  # (the pipelined worker gives its generator a stream of its own again)
    worker = KINDS[kind](vocoder, max_batch, max_wait=0.0, max_batch_frames=FLOW_LIMITS.max_batch_frames,
                         on_batch=lambda size, s: calls.append((time.perf_counter(), size, s)))
    feed = Feed(worker, vocoder, streams, seed)
    try:
        feed.start()
        while not feed.warmed():
            time.sleep(0.01)
        t0 = time.perf_counter()
        time.sleep(seconds)
        t1 = time.perf_counter()
        feed.stop()
    finally:
        worker.stop()
    done = [(t, s) for t, _, s in feed.done if t0 <= t < t1]
    timed = [(size, s) for t, size, s in calls if t0 <= t < t1]
    return {"worker": kind, "streams": streams, "max_batch": max_batch, "seconds": t1 - t0,
            "windows_per_s": len(done) / (t1 - t0), "x_real_time": sum(s for _, s in done) / (t1 - t0),
            "calls_per_s": len(timed) / (t1 - t0), "mean_windows": float(np.mean([n for n, _ in timed])) if timed else 0.0,
            "mean_call_ms": float(np.mean([s for _, s in timed])) * 1e3 if timed else 0.0,
            "p95_call_ms": float(np.percentile([s for _, s in timed], 95)) * 1e3 if timed else 0.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", default="32,64")
    p.add_argument("--max-batch", type=int, default=0, help="windows a call holds at most (0: half the streams)")
    p.add_argument("--seconds", type=float, default=2.5)
    p.add_argument("--preset", default="moss-speech", choices=["moss-speech", "tiny-codec"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--beside-llm", action="store_true", help="each run again beside the llm's decode steps")
    p.add_argument("--json")
    args = p.parse_args()
    with contextlib.ExitStack() as stack:
        llm = None
        if args.beside_llm:  # (before this process touches CUDA)
            from codec_history import BesideLlm

            llm = stack.enter_context(BesideLlm())
        rows = measure(args, llm)
    report(rows, args)


def measure(args, llm) -> list[dict]:
    sizes = [int(n) for n in args.streams.split(",")]
    rows = []
    with torch.inference_mode():
        vocoder = load_vocoder(None, args.preset, device=args.device, flow=FlowOptions(history_streams=max(sizes)))
        for streams in sizes:
            batch = args.max_batch or max(1, streams // 2)
            for place in ("alone", "beside llm") if llm is not None else ("alone",):
                for n, kind in enumerate(("serial", "pipelined", "serial", "pipelined")):
                    calls: list = []
                    if place == "alone":
                        row, llm_ms = run(vocoder, kind, streams, batch, args.seconds, n, calls), None
                    else:
                        row, llm_ms = llm.beside(lambda: run(vocoder, kind, streams, batch, args.seconds, n, calls))
                    rows.append(row | {"place": place, "llm_step_ms": llm_ms})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def report(rows: list[dict], args) -> None:
    print(f"\n{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%dT%H:%M:%S')}, preset {args.preset}, {args.seconds:g} s a run")
    print(f"{'place':<11} {'streams':>7} {'worker':<10} {'windows/s':>9} {'x RT':>6} {'calls/s':>7} {'windows':>7} "
          f"{'call ms':>7} {'p95':>6} {'llm ms':>6} {'vs serial':>9}")
    for r in rows:
        serial = [s["windows_per_s"] for s in rows if s["worker"] == "serial" and s["streams"] == r["streams"]
                  and s["place"] == r["place"]]
        ratio = r["windows_per_s"] / np.mean(serial) if serial and r["worker"] == "pipelined" else None
        print(f"{r['place']:<11} {r['streams']:>7} {r['worker']:<10} {r['windows_per_s']:9.1f} {r['x_real_time']:6.0f} "
              f"{r['calls_per_s']:7.1f} {r['mean_windows']:7.1f} {r['mean_call_ms']:7.1f} {r.get('p95_call_ms', 0):6.1f} "
              f"{r['llm_step_ms'] or 0:6.2f} {'' if ratio is None else f'{ratio:9.2f}x'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
