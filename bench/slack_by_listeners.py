"""Client-side slack against how many listeners were playing, from a `moss-serve bench` run's bench.json: for each
chunk after a stream's first, how early it arrived before its listener would have run out of audio (below 0: a
stall), grouped by the listeners playing at that moment (streams sent and not yet played out). Shows where a load
starts to eat the slack, which a gateway's count of turns running does not: a turn ends at the gateway when its last
chunk is sent, seconds before its listener has heard it (the llm runs ahead of playback).

    python3 bench/slack_by_listeners.py RUN/bench.json [...]     # a table per run
"""

from __future__ import annotations

import json
import sys

import numpy as np


def chunks(level: dict) -> np.ndarray:
    """(listeners playing, slack seconds) per chunk after each stream's first."""
    streams = [s for s in level["streams"] if s["code"] == "OK"]
    starts = np.array([s["sent_s"] for s in streams])
    ends = np.array([s["sent_s"] + s["chunk_arrivals_s"][0] + sum(s["chunk_samples"]) / s["sample_rate"] for s in streams])
    rows = []
    for s in streams:
        arrivals, samples, rate = s["chunk_arrivals_s"], s["chunk_samples"], s["sample_rate"]
        due = arrivals[0] + samples[0] / rate  # the listener starts at the first chunk
        for a, n in zip(arrivals[1:], samples[1:]):
            at = s["sent_s"] + a
            rows.append((((starts <= at) & (ends >= at)).sum(), due - a))
            due = max(due, a) + n / rate
    return np.array(rows).reshape(-1, 2)


def table(rows: np.ndarray, width: int = 32) -> str:
    lines = ["listeners  chunks  slack p1  slack p2  slack p50  late"]
    for low in range(0, int(rows[:, 0].max(initial=0)) + 1, width):
        sel = rows[(rows[:, 0] >= low) & (rows[:, 0] < low + width), 1]
        if len(sel) >= 20:
            p1, p2, p50 = np.percentile(sel, [1, 2, 50])
            lines.append(f"{low:3d}-{low + width - 1:<5d}  {len(sel):6d}  {p1:8.3f}  {p2:8.3f}  {p50:9.3f}  {(sel < 0).mean():5.1%}")
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    for path in paths:
        for label, level in json.loads(open(path).read())["levels"].items():
            print(f"{path} ({label})\n{table(chunks(level))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
