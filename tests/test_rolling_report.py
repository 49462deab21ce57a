"""bench/rolling_report.py: a load's turns around a rolling restart, by when they were sent and how they ended."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0


def stream(sent: float, code: str = "OK", arrivals=(0.2, 0.3), done: float = 1.0) -> dict:
    return dict(sent_s=sent, code=code, error="" if code == "OK" else f"{code.lower()} here", sample_rate=24000,
                chunk_arrivals_s=list(arrivals) if code == "OK" else [],
                chunk_samples=[4800] * len(arrivals) if code == "OK" else [], done_s=done)


def test_turns_are_grouped_by_the_restart_and_a_failure_after_admission_is_told_from_a_refusal(tmp_path):
    streams = [stream(1.0, done=2.0),                                    # ended before the SIGHUP (at 5 s)
               stream(4.0, done=3.0),                                    # running at it
               stream(6.0, code="UNAVAILABLE", done=0.1),                # sent during the restart (5-20 s): failed
               stream(8.0, code="RESOURCE_EXHAUSTED", done=0.01),        # ... refused: not admitted
               stream(9.0, arrivals=(0.3, 0.4, 2.0), done=2.0),          # ... its third chunk late: a stall
               stream(25.0)]                                             # after it
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(dict(levels={"rate 2/s": dict(started_unix=T0, streams=streams)})))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "rolling_report.py"), str(bench), "--hup", str(T0 + 5),
                          "--done", str(T0 + 20), "--json", str(tmp_path / "rolling.json")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads((tmp_path / "rolling.json").read_text())
    assert (got["sighup_s"], got["restart_seconds"]) == (5.0, 15.0)
    assert got["running at the SIGHUP"]["turns"] == 1 and got["sent after it"]["turns"] == 1
    during = got["sent during the restart"]
    assert (during["turns"], during["refused"], during["failed"], during["answered"]) == (3, 1, 1, 1)
    assert during["failed_codes"] == {"UNAVAILABLE": 1} and during["stall_free_share"] == 0.0
    assert got["whole load"]["failed"] == 1 and got["whole load"]["stall_free_share"] == 0.75
    assert "| sent during the restart | 3 | 1 | 1 {'UNAVAILABLE': 1} | 1 | 0.0% |" in out.stdout
    assert "sent during the restart, failed: unavailable here" in out.stdout
    # a round that never ended: everything after the SIGHUP counts as sent during it
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "rolling_report.py"), str(bench), "--hup", str(T0 + 5),
                          "--done", "null"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "longer than the load" in out.stdout
    assert "| sent during the restart | 4 |" in out.stdout
