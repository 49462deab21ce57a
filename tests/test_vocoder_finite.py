"""bench/vocoder_finite.py's plumbing on a CPU: the vocoder started per variant, streams played through it, its
NaN counters read back (none on the tiny codec), a row and a JSON per variant."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_each_variant_plays_its_streams_and_reads_the_vocoders_nan_counters(tmp_path):
    out = tmp_path / "finite.json"
    done = subprocess.run([sys.executable, "bench/vocoder_finite.py", "--device", "cpu", "--preset", "tiny-codec",
                           "--streams", "5", "--concurrency", "3", "--reply", "1-2", "--pace", "0.01",
                           "--variant", "defaults=", "--variant", "no-history=--flow-history-streams 0",
                           "--log-dir", str(tmp_path), "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["defaults", "no-history"]
    assert rows[1]["flags"] == ["--flow-history-streams", "0"]
    for r in rows:
        assert r["streams"] == 5 and 5 * 1.0 <= r["audio_seconds"] <= 5 * 2.2
        assert r["windows_mel"] == r["windows_generator"] == r["samples_silenced"] == 0
        assert r["streams_with_nonfinite_at_client"] == 0
    assert "no-history" in done.stdout.splitlines()[-2]
    assert (tmp_path / "vocoder_no-history.log").exists()
