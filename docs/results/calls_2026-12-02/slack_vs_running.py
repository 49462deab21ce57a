#!/usr/bin/env python3
"""Each stream's second chunk's slack at the client against the turns running when it arrived, from `moss-serve
bench`'s bench.json: a turn runs from its request's sending to its last chunk's arrival (at the client, as the
gateway's own count runs from arrival to its summary), and the slack is when the listener, playing from the first
chunk's arrival, would run out of the first chunk's audio, less the second chunk's arrival.
  python3 docs/results/calls_2026-12-02/slack_vs_running.py <bench.json>..."""

import json
import sys

import numpy as np

BANDS = ((0, 30), (30, 40), (40, 50), (50, 60), (60, 256))  # turns running

for path in sys.argv[1:]:
    levels = json.load(open(path))["levels"]
    streams = [s for s in next(iter(levels.values()))["streams"] if s["code"] == "OK" and len(s["chunk_arrivals_s"]) >= 2]
    spans = [(s["sent_s"], s["sent_s"] + s["chunk_arrivals_s"][-1]) for s in streams]
    running, slack = [], []
    for s in streams:
        arrivals, samples = s["chunk_arrivals_s"], s["chunk_samples"]
        second = s["sent_s"] + arrivals[1]
        running.append(sum(1 for a, b in spans if a <= second <= b))
        slack.append((arrivals[0] + samples[0] / s["sample_rate"] - arrivals[1]) * 1e3)
    running, slack = np.array(running), np.array(slack)
    print(f"{path}: {len(streams)} streams")
    print("| turns running | second chunks | slack p2 | p10 | p50 |\n| --- | --- | --- | --- | --- |")
    for lo, hi in BANDS:
        part = slack[(running >= lo) & (running < hi)]
        if len(part) >= 5:
            print(f"| {lo}-{hi} | {len(part)} | {np.percentile(part, 2):.0f} ms | {np.percentile(part, 10):.0f} ms "
                  f"| {np.percentile(part, 50):.0f} ms |")
    print()
