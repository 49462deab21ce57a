"""bench/studies/vocoder_finite.py's plumbing on a CPU: the vocoder started per variant, streams played through it, its
NaN counters read back (none on the tiny codec), streams played again alone and compared, a row and a JSON per
variant."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_each_variant_plays_its_streams_and_reads_the_vocoders_nan_counters(tmp_path):
    out = tmp_path / "finite.json"
    done = subprocess.run([sys.executable, "bench/studies/vocoder_finite.py", "--device", "cpu", "--preset", "tiny-codec",
                           "--streams", "3", "--concurrency", "2", "--reply", "1-2", "--pace", "0.01", "--alone", "2",
                           "--variant", "defaults=", "--variant", "no-history=--flow-history-streams 0",
                           "--log-dir", str(tmp_path), "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["defaults", "no-history"]
    assert rows[1]["flags"] == ["--flow-history-streams", "0"]
    for r in rows:
        assert r["streams"] == 3 and 3 * 1.0 <= r["audio_seconds"] <= 3 * 2.2
        assert r["windows_mel"] == r["windows_generator"] == r["samples_silenced"] == 0
        assert r["streams_with_nonfinite_at_client"] == 0
        # played 2 at once, then alone: the same samples (float32 on a CPU: to rounding)
        assert r["alone_checked"] == 2 and r["window_snr_db_min"] > 60, r["window_snr_db"]
    assert "no-history" in done.stdout.splitlines()[-2]
    assert (tmp_path / "vocoder_no-history.log").exists()


def test_agreement_finds_the_one_window_that_went_wrong():
    import importlib.util

    import numpy as np

    sys.path.insert(0, str(ROOT / "bench" / "studies"))  # (its bench_path)
    spec = importlib.util.spec_from_file_location("vocoder_finite", ROOT / "bench" / "studies" / "vocoder_finite.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = np.random.default_rng(0)
    alone = rng.standard_normal(24000).astype(np.float32) * 0.1
    loaded = alone + rng.standard_normal(24000).astype(np.float32) * 1e-5  # float error: ~80 dB
    whole, worst = bench.agreement(loaded, alone, 24000)
    assert whole > 70 and worst > 70
    loaded[4800:4900] = rng.standard_normal(100) * 0.1  # 4 ms of another stream's audio
    whole, worst = bench.agreement(loaded, alone, 24000)
    assert worst < 15 and whole > worst + 5  # (the stream dilutes it: one window of ten)
    assert bench.agreement(loaded[:-1], alone, 24000) == (float("-inf"), float("-inf"))  # lengths differ
