"""A stream's first block through a running solve (codec/solve.py: rows join at the next Euler step) against today's
calls (codec/decoder.py: all rows through all 10 steps together), at the real size on one GPU.

    python bench/studies/codec_solve.py --streams 16 --json out.json
    python bench/studies/codec_solve.py --streams 16,24 --admit-every 4

The flow at the real size (random weights, bf16, CUDA graphs, stream history on). N streams play in the steady state
(chunks of 20 tokens); a new stream's first block (8 tokens) comes in.
- calls: the first block waits for the call in flight (N steady rows), then rides the next call with the next N
  steady rows: its latency is a call's time plus, on average, half a call's (reported: one call of N + 1 rows, and
  the mean wait);
- solve: the N rows are in flight at staggered steps (a stream's next chunk admitted as its last leaves, a tick's
  admissions in one batch); the first block is admitted between two ticks with them and leaves 10 ticks later
  (reported: that admission, a tick, its latency from the admission's start). --admit-every k: the playing
  streams' next chunks join every k ticks (with a first block at once), fewer admissions between ticks.
Throughput: row-steps per second of each (a call of N rows: 10·N row-steps).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import time
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch

from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import PRESETS
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.solve import FlowSolve
from services.vocoder.codec.voice import random_voice

WARM = (8, 5, 10)   # the gateway's chunks before the steady 20
CHUNK = 20


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def ms(fn) -> float:
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t) * 1e3


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--streams", default="16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--admit-every", type=int, default=1, help="ticks between admissions of playing streams' chunks "
                   "(a first block is admitted at once)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="moss-speech", choices=list(PRESETS), help="tiny: a dry run on a CPU")
    args = p.parse_args()
    device, cfg = torch.device(args.device), PRESETS[args.preset]()
    voice = random_voice(cfg.flow, prompt_tokens=40 if args.preset == "moss-speech" else 10, seed=3)
    vocab = cfg.flow.vocab_size
    g = torch.Generator().manual_seed(1)
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "torch": torch.__version__, "cells": {},
           "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    for n in (int(x) for x in args.streams.split(",")):
        tokens = torch.randint(0, vocab, (n + args.reps + 1, 2000), generator=g).tolist()
        d = FlowTokenDecoder(random_codec(cfg, 0)[0], device, history_streams=n + args.reps + 2)
        d.set_voices([voice])
        states = [d.start(voice) for _ in range(n)]
        at = 0
        for c in WARM:                                    # to the steady state, every stream together
            states = [s for _, s in d.decode_chunks([(tokens[i][at : at + c], s) for i, s in enumerate(states)])]
            at += c
        sent = [at] * n

        def chunk(i):
            rows = [(tokens[i][sent[i] : sent[i] + CHUNK], states[i])]
            sent[i] += CHUNK
            return rows

        # -- calls: N steady rows, and N steady rows with a first block riding along (graphs captured first)
        calls, calls_first = [], []
        for r in range(args.reps + 1):
            rows = [chunk(i)[0] for i in range(n)]
            t = ms(lambda: rows.__setitem__(slice(None), d.decode_chunks(rows)))
            states[:] = [s for _, s in rows]
            new = d.start(voice)
            rows = [chunk(i)[0] for i in range(n)] + [(tokens[n + r][:8], new)]
            t1 = ms(lambda: rows.__setitem__(slice(None), d.decode_chunks(rows)))
            states[:] = [s for _, s in rows[:n]]
            d.release(rows[n][1])
            if r:                                        # (the first of each: graph capture)
                calls.append(t)
                calls_first.append(t1)
        call, call_first = statistics.median(calls), statistics.median(calls_first)

        # -- solve: the N streams in flight at staggered steps, then first blocks joining; each tick's admissions
        #    (streams whose last chunk just left, a first block) in one batch
        solve = FlowSolve(d, capacity=n + 2)
        solve.warm_up()
        ticks, latencies, admits = [], [], []
        pending, due = list(range(n)), []
        first_at, first_state, joined = None, None, 0
        for tick in range(40 * (args.reps + 3)):
            rows, tags = [], []
            if pending and tick % 2 == 0:                # two streams a tick join until all are in flight
                due += pending[:2]
                pending = pending[2:]
            first = not pending and first_at is None and tick >= 30 and joined < args.reps
            if first or pending or tick % args.admit_every == 0:   # playing streams' chunks wait a few ticks
                for i in due:
                    rows.append(plan_row(d, states, i, tokens[i][sent[i] : sent[i] + CHUNK]))
                    tags.append(("steady", i))
                    sent[i] += CHUNK
                due = []
            if first:
                first_state = [d.start(voice)]
                rows.append(plan_row(d, first_state, 0, tokens[n + joined][:8]))
                tags.append(("first", joined))
            if rows:
                t = ms(lambda: solve.admit(rows, tags))
                if first:
                    admits.append(t)
                    first_at = time.perf_counter() - t / 1e3
            finished = [None]
            t = ms(lambda: finished.__setitem__(0, solve.tick()))
            ticks.append((len(solve.flight) + len(finished[0]), t))
            for tag, _ in finished[0]:
                if tag[0] == "steady":
                    due.append(tag[1])                   # its next chunk joins before the next tick
                else:
                    latencies.append((time.perf_counter() - first_at) * 1e3)
                    first_at, joined = None, joined + 1
                    d.release(first_state[0])
        steady_ticks = [t for rows, t in ticks[25:] if rows >= n]
        tick_ms = statistics.median(steady_ticks)
        cell = {"call_ms": call, "call_with_first_ms": call_first,
                "first_block_by_calls_ms": call_first + call / 2,
                "tick_ms": tick_ms, "admit_ms": statistics.median(admits), "first_block_by_solve_ms": statistics.median(latencies),
                "row_steps_per_s_calls": 10 * n / call * 1e3, "row_steps_per_s_solve": n / tick_ms * 1e3}
        out["cells"][str(n)] = cell
        print(f"{n} streams: call {call:.1f} ms (+ a first block {call_first:.1f}); first block by calls "
              f"{cell['first_block_by_calls_ms']:.1f} ms (its call + half a call's wait); tick {tick_ms:.2f} ms, admit "
              f"{cell['admit_ms']:.1f} ms, first block by the solve {cell['first_block_by_solve_ms']:.1f} ms; "
              f"row-steps/s calls {cell['row_steps_per_s_calls']:.0f}, solve {cell['row_steps_per_s_solve']:.0f}",
              flush=True)
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}")
    print(f"{'streams':>7s} {'call':>7s} {'1st by calls':>12s} {'tick':>6s} {'admit':>6s} {'1st by solve':>12s} "
          f"{'steps/s calls':>13s} {'steps/s solve':>13s}")
    for n, c in out["cells"].items():
        print(f"{n:>7s} {c['call_ms']:7.1f} {c['first_block_by_calls_ms']:12.1f} {c['tick_ms']:6.2f} {c['admit_ms']:6.1f} "
              f"{c['first_block_by_solve_ms']:12.1f} {c['row_steps_per_s_calls']:13.0f} {c['row_steps_per_s_solve']:13.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def plan_row(d: FlowTokenDecoder, states: list, i: int, tokens: list[int]):
    """Stream i's chunk planned as decode_chunks plans a history row → (state, plan); its state advanced."""
    state = dataclasses.replace(states[i], tokens=states[i].tokens + tuple(tokens))
    state = d._assign(state)
    plan = d.plan(state, state.received, False, capped=True)
    states[i] = d.advance(state, plan)
    return state, plan


if __name__ == "__main__":
    main()
