"""Two flow calls side by side against one call of both: is a steady call of a few windows bound by its
kernels' latency (the GPU idle under it: two calls side by side take about the time of one) or by their work (two
side by side take as long as one call of both)? At the real size, random weights, bf16, each stream's history on, as
the vocoder's workers run them: each call from its own thread, with graphs of its own (FlowTokenDecoder.lane) and its
own CUDA stream.

    python bench/studies/flow_concurrency.py --windows 3,6 --json out.json

For each N: one call of N windows; one call of 2N; two calls of N one after the other; two calls of N side by side.
Prints a table (median wall ms of each, from the host, over --reps) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
from codec_flow_profile import CHUNK, WARM_CHUNKS, steady_rows

from measure import gpu_record
from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import moss_speech
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.voice import random_voice


def wall(fn, reps: int) -> float:
    """Median seconds of fn() from the host, the device drained after each."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def side_by_side(calls) -> None:
    """Each (decoder, rows, stream) called from a thread of its own, at once; returns when all are done."""
    def run(decoder, rows, stream):
        with torch.inference_mode(), torch.cuda.stream(stream):  # (inference mode is each thread's own)
            decoder.decode_chunks(rows)
        stream.synchronize()

    threads = [threading.Thread(target=run, args=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", default="3,6", help="N: windows of each of the two calls (comma-separated)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json")
    args = p.parse_args()
    device, cfg = torch.device("cuda"), moss_speech()
    counts = [int(n) for n in args.windows.split(",")]
    most = 2 * max(counts)
    voice = random_voice(cfg.flow, prompt_tokens=40, seed=3)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.flow.vocab_size, (most, sum(WARM_CHUNKS) + CHUNK), generator=g).tolist()
    d = FlowTokenDecoder(random_codec(cfg, 0)[0], device, history_streams=most)
    d.set_voices([voice])
    lane = d.lane()
    rows = steady_rows(d, voice, tokens)
    streams = [torch.cuda.Stream(device), torch.cuda.Stream(device)]
    out = gpu_record(reps=args.reps)
    for n in counts:
        a, b = rows[:n], rows[n : 2 * n]
        lane.decode_chunks(b)  # the lane's graph for N windows
        cells = {f"one call of {n}": wall(lambda: d.decode_chunks(a), args.reps),
                 f"one call of {2 * n}": wall(lambda: d.decode_chunks(a + b), args.reps),
                 f"two calls of {n}, one after the other": wall(lambda: (d.decode_chunks(a), lane.decode_chunks(b)),
                                                                  args.reps),
                 f"two calls of {n}, side by side": wall(lambda: side_by_side([(d, a, streams[0]),
                                                                               (lane, b, streams[1])]), args.reps)}
        out["cells"][n] = {k: v * 1e3 for k, v in cells.items()}
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}; median wall ms of {args.reps}")
    print("| N | one call of N | one call of 2N | two of N, one after the other | two of N, side by side | "
          "side by side / one of N |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n, c in out["cells"].items():
        one, both, seq, side = c.values()
        print(f"| {n} | {one:.1f} | {both:.1f} | {seq:.1f} | {side:.1f} | {side / one:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
