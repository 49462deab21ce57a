#!/usr/bin/env python3
"""Each chunk's slack at the client by its place in its stream, from `moss-serve bench`'s bench.json: when it arrived
against when its listener, playing from the first chunk's arrival, would have run out of audio. The bench's own table
(services/bench/report.py, slack_table) over a bench.json written before the bench printed it.
  python3 docs/results/defaults_2026-12-01/slack_by_chunk.py <bench.json>..."""

import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[3]), str(Path(__file__).resolve().parents[3] / "protos")]

from services.bench import report  # noqa: E402
from services.bench.stream import StreamRecord  # noqa: E402

for path in sys.argv[1:]:
    levels = {}
    for label, level in json.loads(Path(path).read_text())["levels"].items():
        ok = [StreamRecord(sent=0.0, code=s["code"], sample_rate=s["sample_rate"], stages=s["stages"],
                           chunks=list(zip(s["chunk_arrivals_s"], s["chunk_samples"]))) for s in level["streams"]]
        levels[label] = report.summarize(ok, level["summary"]["wall_seconds"])
    print(f"{path}\n{report.slack_table(levels, markdown=True)}\n")
