"""bench/overload_report.py: per gateway and load, the slack shares from the gateway's scrapes before and after the
load, and the vocoder's windows with NaN or inf in it (from its scrapes beside them; "-" where it counts none)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("overload_report", ROOT / "bench" / "overload_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

SUMMARY = dict(requests=10, ok=8, refused=2, stall_free_share=1.0, ttfa_seconds=dict(p50=0.2, p95=0.25),
               offered_per_second=5.0, goodput_per_second=4.0, refusal_seconds=dict(max=0.004), refusals_with_hint=2,
               audio_x_realtime_offered=187.4)


def slack(le0: int, total: int) -> str:
    return (f'gateway_playback_slack_seconds_bucket{{le="0.0"}} {le0}\n'
            f'gateway_playback_slack_seconds_bucket{{le="+Inf"}} {total}\n')


def nonfinite(mel: int, generator: int) -> str:
    return (f'vocoder_nonfinite_windows_total{{stage="mel"}} {mel}.0\n'
            f'vocoder_nonfinite_windows_total{{stage="generator"}} {generator}.0\n')


def test_each_load_gets_its_slack_shares_and_the_vocoders_nan_windows(tmp_path):
    for name, vocoder_counts in (("a", True), ("b", False)):
        g = tmp_path / name
        (g / "poisson_30").mkdir(parents=True)
        (g / "poisson_30" / "bench.json").write_text(json.dumps({"levels": {"rate 30/s": {"summary": SUMMARY}}}))
        (g / "metrics_00_start.txt").write_text(slack(0, 100))
        (g / "metrics_01_poisson_30.txt").write_text(slack(5, 200))
        (g / "metrics_llm_00_start.txt").write_text("")
        (g / "metrics_vocoder_00_start.txt").write_text(nonfinite(1, 0) if vocoder_counts else "")
        (g / "metrics_vocoder_01_poisson_30.txt").write_text(nonfinite(3, 2) if vocoder_counts else "")
    rows = report.rows(tmp_path)
    assert [(r["gateway"], r["load"]) for r in rows] == [("a", "poisson_30"), ("b", "poisson_30")]
    assert rows[0]["slack<=0.0"] == 0.05 and rows[0]["admitted"] == 8
    assert rows[0]["nonfinite_windows"] == 4 and rows[1]["nonfinite_windows"] is None
    lines = report.table(rows).splitlines()
    column = lines[0].index("NaN windows")
    assert lines[1][column:].split()[0] == "4" and lines[2][column:].split()[0] == "-"
    column = lines[0].index("xRT offered")  # the audio made a second while the load was offered
    assert lines[1][column:].split()[0] == "187" and rows[0]["audio_x_realtime_offered"] == 187.4


def test_first_audio_by_ttfa_band_from_the_admitted_streams_stages():
    """The fastest half and the slowest tenth of the admitted streams by TTFA, each band's mean TTFA, llm first chunk,
    the rest (the vocoder's side) and the vocoder's queue; refused streams are not counted."""
    def stream(ttfa_ms, llm_ms, queue_ms=None, code="OK"):
        stages = {"ttfa_seconds": ttfa_ms / 1e3, "llm_first_chunk_seconds": llm_ms / 1e3}
        if queue_ms is not None:
            stages["vocoder_first_chunk_queue_seconds"] = queue_ms / 1e3
        return {"code": code, "stages": stages if code == "OK" else {}}

    # 20 admitted: TTFA 100, 110, ..., 290 ms; llm 60 ms each; the queue 5 ms, 50 ms for the two slowest; 3 refused
    streams = [stream(100 + 10 * k, 60, 50 if k >= 18 else 5) for k in range(20)][::-1]
    streams += [stream(0, 0, code="RESOURCE_EXHAUSTED")] * 3
    bands = report.ttfa_bands(streams)
    fast, slow = bands["fastest half"], bands["slowest tenth"]
    assert fast["streams"] == 10 and slow["streams"] == 2
    assert abs(fast["ttfa"] - 0.145) < 1e-9 and abs(slow["ttfa"] - 0.285) < 1e-9
    assert abs(fast["vocoder_side"] - 0.085) < 1e-9 and abs(slow["vocoder_side"] - 0.225) < 1e-9
    assert abs(fast["vocoder_queue"] - 0.005) < 1e-9 and abs(slow["vocoder_queue"] - 0.05) < 1e-9
    # a stack whose vocoder reports no queue: nan, printed as such; no admitted stream: empty bands
    assert math.isnan(report.ttfa_bands([stream(200, 100)])["slowest tenth"]["vocoder_queue"])
    assert report.ttfa_bands([])["fastest half"]["streams"] == 0
    text = report.bands_table([{"gateway": "a", "load": "poisson_30", "ttfa_bands": bands}])
    assert "slowest tenth  2        285.0 ms" in text and "225.0 ms" in text
