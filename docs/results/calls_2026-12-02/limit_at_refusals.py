"""The admission limit as a client sees it: the turns running when each refusal came, by 2-second span, and how long
the admitted turns lasted (sent to their last chunk). Read from each load's bench.json (`moss-serve bench --out`).

    cd /tmp && tar xJf /work/main/docs/results/calls_2026-12-02/defaults.tar.xz
    python /work/main/docs/results/calls_2026-12-02/limit_at_refusals.py defaults    (DIR...: a variant's files)

A span's cell is `running/refused` at its first refusal (the limit then, less the turns that had just ended), or
`(running)` where none was refused. A second line: the audio the clients received a second (x real time), by 4 s span
from the load's start (what the vocoder made, the drain after the load included). A third, where the load's directory
holds the vocoder's scrapes before and after it (loads.sh): its main worker's calls by their windows, count and mean.
A fourth, where any admitted stream stalled: each stall as `sent@chunk+late` (the turn's sending, seconds into the
load; the stalled chunk's place in its stream from 1; how late it came, ms, by the bench's own playback clock).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location("overload_report",
                                               Path(__file__).resolve().parents[3] / "bench" / "overload_report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from services.bench.stream import StreamRecord  # noqa: E402  (the bench's own playback clock and jitter)

SPAN = 2.0  # seconds


def turns(bench: Path) -> list[dict]:
    levels = json.loads(bench.read_text())["levels"]
    return next(iter(levels.values()))["streams"]


def row(streams: list[dict]) -> tuple[float, list[str]]:
    played = [(s["sent_s"], s["sent_s"] + s["chunk_arrivals_s"][-1])
              for s in streams if s["code"] == "OK" and s["chunk_arrivals_s"]]
    refused = [s["sent_s"] for s in streams if s["code"] != "OK"]
    cells = []
    last = max([s["sent_s"] for s in streams], default=0.0)
    for k in range(int(last // SPAN) + 4):
        start = k * SPAN
        here = [t for t in refused if start <= t < start + SPAN]
        at = here[0] if here else start + SPAN / 2
        running = sum(1 for sent, end in played if sent <= at < end)
        cells.append(f"{start:g}s:{running}/{len(here)}" if here else f"{start:g}s:({running})")
    return report.turns_and_limit(streams)["turn_p50"], cells


def received(streams: list[dict], span: float = 4.0) -> list[str]:
    seconds: dict[int, float] = {}
    for x in streams:
        if x["code"] == "OK":
            for at, samples in zip(x["chunk_arrivals_s"], x["chunk_samples"]):
                k = int((x["sent_s"] + at) // span)
                seconds[k] = seconds.get(k, 0.0) + samples / x["sample_rate"]
    return [f"{k * span:g}s:{seconds[k] / span:.0f}x" for k in sorted(seconds)]


def stalls(streams: list[dict]) -> list[str]:
    found = []
    for x in streams:
        if x["code"] != "OK":
            continue
        record = StreamRecord(sent=0.0, code="OK", sample_rate=x["sample_rate"],
                              chunks=list(zip(x["chunk_arrivals_s"], x["chunk_samples"])))
        lateness = record.lateness()
        found += [f"{x['sent_s']:.1f}@{k + 1}+{late * 1e3:.0f}" for k, late in enumerate(lateness) if late in record.stalls()]
    return found


def main(dirs: list[str]) -> None:
    for d in dirs:
        for bench in sorted(Path(d).glob("**/bench.json")):
            streams = turns(bench)
            lasted, cells = row(streams)
            print(f"{Path(d).name:10} {bench.parent.name:11} turn p50 {lasted:.2f} s  {' '.join(cells)}")
            print(f"{'':10} {'':11} received    {' '.join(received(streams))}")
            before, after = bench.parent / "metrics_vocoder_before.txt", bench.parent / "metrics_vocoder_after.txt"
            if before.exists() and after.exists() and (calls := report.calls_by_size(before.read_text(), after.read_text())):
                print(f"{'':10} {'':11} calls       " + " ".join(
                    f"{size}: {c['calls']:.0f}, {c['mean_seconds'] * 1e3:.1f} ms" for size, c in calls.items() if c["calls"]))
            if found := stalls(streams):
                print(f"{'':10} {'':11} stalls      {' '.join(found)}")


if __name__ == "__main__":
    main(sys.argv[1:])
