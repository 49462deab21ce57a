#!/usr/bin/env python3
"""Each stream's second chunk's slack at the client against the turns running when it arrived, from `moss-serve
bench`'s bench.json: a turn runs from its request's sending to its last chunk's arrival (at the client, as the
gateway's own count runs from arrival to its summary), and the slack is when the listener, playing from the first
chunk's arrival, would run out of the first chunk's audio, less the second chunk's arrival. Where the gateway's
summaries carry the second chunk's parts (since 7365f76), those too by the same bands: the llm's (its second token chunk
after its first), the vocoder's (tokens in → audio ready), of it the wait for a call, and the rest (its own call).
  python3 docs/results/calls_2026-12-02/slack_vs_running.py <bench.json>..."""

import json
import sys

import numpy as np

BANDS = ((0, 30), (30, 40), (40, 50), (50, 60), (60, 256))  # turns running

for path in sys.argv[1:]:
    levels = json.load(open(path))["levels"]
    streams = [s for s in next(iter(levels.values()))["streams"] if s["code"] == "OK" and len(s["chunk_arrivals_s"]) >= 2]
    spans = [(s["sent_s"], s["sent_s"] + s["chunk_arrivals_s"][-1]) for s in streams]
    running, slack, parts = [], [], []
    for s in streams:
        arrivals, samples = s["chunk_arrivals_s"], s["chunk_samples"]
        second = s["sent_s"] + arrivals[1]
        running.append(sum(1 for a, b in spans if a <= second <= b))
        slack.append((arrivals[0] + samples[0] / s["sample_rate"] - arrivals[1]) * 1e3)
        st = s["stages"]
        parts.append([st.get(k, np.nan) * 1e3 for k in ("llm_second_chunk_seconds", "vocoder_second_chunk_in_vocoder_seconds",
                                                         "vocoder_second_chunk_queue_seconds")])
    running, slack, parts = np.array(running), np.array(slack), np.array(parts)
    print(f"{path}: {len(streams)} streams")
    print("| turns running | second chunks | slack p2 | p10 | p50 |\n| --- | --- | --- | --- | --- |")
    for lo, hi in BANDS:
        part = slack[(running >= lo) & (running < hi)]
        if len(part) >= 5:
            print(f"| {lo}-{hi} | {len(part)} | {np.percentile(part, 2):.0f} ms | {np.percentile(part, 10):.0f} ms "
                  f"| {np.percentile(part, 50):.0f} ms |")
    print()
    if np.isnan(parts).all():
        continue
    print("| turns running | llm p50 | vocoder p50 / p90 | its wait for a call p50 / p90 | its own call p50 |\n"
          "| --- | --- | --- | --- | --- |")
    for lo, hi in BANDS:
        part = parts[(running >= lo) & (running < hi)]
        if len(part) >= 5:
            llm, voc, wait = part[:, 0], part[:, 1], part[:, 2]
            print(f"| {lo}-{hi} | {np.nanmedian(llm):.0f} ms | {np.nanmedian(voc):.0f} / {np.nanpercentile(voc, 90):.0f} ms "
                  f"| {np.nanmedian(wait):.0f} / {np.nanpercentile(wait, 90):.0f} ms | {np.nanmedian(voc - wait):.0f} ms |")
    print()
