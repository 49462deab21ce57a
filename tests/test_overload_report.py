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


def test_how_long_turns_ran_and_the_turns_running_at_each_refusal():
    """A turn runs at the client from its sending to its last chunk; at each refusal the turns running then are the
    limit as the client saw it: the most of them and at the last refusal, nan (printed "-") without refusals."""
    def turn(sent, last, code="OK"):
        return {"sent_s": sent, "code": code, "chunk_arrivals_s": [0.1, last] if code == "OK" else []}

    # turns of 2, 2 and 4 s sent at 0, 0.5 and 1 s; refusals at 1.2 s (3 running), 2.7 s (1: the first two ended at
    # 2.0 and 2.5 s) and 6 s (none); an error at 1.5 s is no refusal
    streams = [turn(0.0, 2.0), turn(0.5, 2.0), turn(1.0, 4.0), turn(2.7, 0, "RESOURCE_EXHAUSTED"),
               turn(1.2, 0, "RESOURCE_EXHAUSTED"), turn(6.0, 0, "RESOURCE_EXHAUSTED"), turn(1.5, 0, "UNAVAILABLE")]
    got = report.turns_and_limit(streams)
    assert got == {"turn_p50": 2.0, "running_at_refusals_max": 3, "running_at_last_refusal": 0}
    assert report.turns_and_limit(streams[:4])["running_at_last_refusal"] == 1
    assert math.isnan(report.turns_and_limit(streams[:3] + streams[-1:])["running_at_refusals_max"])  # an error only
    line = report.table([{"gateway": "a", "load": "ramp_256", "requests": 6, "admitted": 3, "refused": 3,
                          "other_errors": 0, "stall_free_share": 1.0, "ttfa_p50": 0.2, "ttfa_p95": 0.3,
                          "offered_per_second": 1.0, "goodput_per_second": 0.5, "refusal_max": 0.003, **got}])
    head, row = line.splitlines()
    column = head.index("running at refusals")
    assert head[head.index("turn p50"):].startswith("turn p50") and "2.00 s" in row and row[column:].startswith("3, 0")


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
    # a turn that waited for a place: its wait is a part of TTFA and of the llm's first chunk at the gateway, and
    # comes out of the llm's; a stream recorded before the bench had the field waited nothing
    waited = stream(300, 160, 5)
    waited["stages"]["admission_wait_seconds"] = 0.1
    band = report.ttfa_bands([waited, stream(200, 60, 5)])["slowest tenth"]
    assert abs(band["admission"] - 0.1) < 1e-9 and abs(band["llm"] - 0.06) < 1e-9 and abs(band["vocoder_side"] - 0.14) < 1e-9
    assert report.ttfa_bands([stream(200, 60)])["fastest half"]["admission"] == 0.0
    text = report.bands_table([{"gateway": "a", "load": "poisson_30", "ttfa_bands": bands}])
    assert "slowest tenth  2        285.0 ms" in text and "225.0 ms" in text


def stage_page(step_s: float, steps: int, batch: int, paced: float, call_s: float, calls: int, windows: int,
               audio: float) -> str:
    return (f"llm_step_seconds_sum {step_s}\nllm_step_seconds_count {steps}\nllm_batch_size_sum {batch}\n"
            f"llm_paced_seconds_total {paced}\nvocoder_batch_seconds_sum {call_s}\nvocoder_batch_seconds_count {calls}\n"
            f"vocoder_batch_size_sum {windows}\nvocoder_audio_seconds_total {audio}\n")


def timeline_tsv(start: float, halves: list[tuple[float, float]]) -> str:
    """A timeline from `start` with one sample each half second; `halves`: each half second's llm step seconds and
    vocoder call seconds (12 ms steps of 20 sequences; 80 ms calls of 8 windows; 5 s of audio a call-second)."""
    head = "\t".join(["t", "gateway_admission_limit", "gateway_active_requests", "gateway_queued_turns",
                      *report.STAGE_COUNTERS])
    lines, llm, voc = [head], 0.0, 0.0
    for k in range(len(halves) + 1):
        steps, calls = llm / 0.012, voc / 0.08
        lines.append("\t".join(str(v) for v in (start + 0.5 * k, 48, 10, 0, llm, steps, 20 * steps, 0.0, voc, calls,
                                                8 * calls, 5 * voc)))
        if k < len(halves):
            llm, voc = llm + halves[k][0], voc + halves[k][1]
    return "\n".join(lines) + "\n"


def test_the_stages_work_over_a_load_and_half_second_by_half_second(tmp_path):
    """From bench/timeline.py's samples over the load's wall time (bench.json's started_unix and wall_seconds): the
    steps' and calls' counts, sizes and time, each stage's busy share, the half seconds each was busy (>= 80%), and
    of the half seconds with a refusal, those in which both were."""
    g = tmp_path / "a"
    (g / "poisson_30").mkdir(parents=True)
    summary = SUMMARY | {"wall_seconds": 2.0}
    # refused at 1000.3 (a half second of the llm alone busy), 1000.7 and 1000.8 (both busy), 1002.2 (both); an
    # admitted turn at 1001.2 (the vocoder alone) is no refusal
    streams = [{"sent_s": t, "code": "RESOURCE_EXHAUSTED"} for t in (0.1, 0.5, 0.6, 2.0)] + [{"sent_s": 1.0, "code": "OK"}]
    (g / "poisson_30" / "bench.json").write_text(json.dumps({"levels": {"rate 30/s": {
        "summary": summary, "started_unix": 1000.2, "streams": streams}}}))
    (g / "metrics_00_start.txt").write_text(slack(0, 100))
    (g / "metrics_01_poisson_30.txt").write_text(slack(5, 200))
    # samples from 999.5 to 1002.5 a half second apart: the load's 1000.2-1002.2 is counted from 1000.0 to 1002.5, five
    # half seconds with 1.5 s of steps and 1.5 s of calls, three of them busy for each stage, two for both
    halves = [(0.0, 0.0), (0.45, 0.1), (0.45, 0.45), (0.1, 0.45), (0.0, 0.0), (0.5, 0.5)]
    (g / "timeline.tsv").write_text(timeline_tsv(999.5, halves))
    work = report.rows(tmp_path)[0]["stage_work"]
    assert work["source"] == "timeline" and work["seconds"] == 2.5 and work["halves"] == 5
    assert abs(work["llm_busy"] - 0.6) < 1e-9 and abs(work["vocoder_busy"] - 0.6) < 1e-9
    assert abs(work["llm_step_ms"] - 12) < 1e-6 and abs(work["llm_batch"] - 20) < 1e-6
    assert abs(work["vocoder_windows_per_call"] - 8) < 1e-6 and abs(work["audio_per_vocoder_second"] - 5) < 1e-6
    assert (work["halves_llm_busy"], work["halves_vocoder_busy"], work["halves_both_busy"]) == (0.6, 0.6, 0.4)
    assert work["refusal_halves"] == 3 and abs(work["refusal_halves_both_busy"] - 2 / 3) < 1e-9
    text = report.work_table([{"gateway": "a", "load": "poisson_30", "stage_work": work}])
    assert text.splitlines()[1].split()[2:4] == ["timeline", "2.5"] and text.split()[-4:] == ["60%/60%/40%", "67%", "of", "3"]
    # a timeline that stops before the load ends does not cover it: no stage work from it
    assert report.timeline_work(report.read_timeline(g / "timeline.tsv"), 1000.2, 1004.0) is None


def test_without_the_stages_counters_in_the_timeline_the_scrapes_beside_the_gateways_give_the_work(tmp_path):
    """An older run (its timeline has the gateway's gauges only; bench.json no started_unix): the stages' scrapes
    before and after the load over its wall seconds, with no half seconds."""
    g = tmp_path / "a"
    (g / "ramp_256").mkdir(parents=True)
    (g / "ramp_256" / "bench.json").write_text(json.dumps({"levels": {"256 streams": {"summary": SUMMARY | {
        "wall_seconds": 20.0}}}}))
    (g / "timeline.tsv").write_text("t\tgateway_admission_limit\tgateway_active_requests\tgateway_queued_turns\n"
                                    "1.0\t48\t0\t0\n")
    (g / "metrics_00_start.txt").write_text(slack(0, 100))
    (g / "metrics_01_ramp_256.txt").write_text(slack(5, 200))
    # each stage's page as it serves it, and a counter of the other's name on it (a stage's own page is what counts)
    (g / "metrics_llm_00_start.txt").write_text(stage_page(0, 0, 0, 0, 99, 9, 9, 9))
    (g / "metrics_vocoder_00_start.txt").write_text(stage_page(99, 9, 9, 9, 0, 0, 0, 0))
    (g / "metrics_llm_01_ramp_256.txt").write_text(stage_page(8.0, 640, 12800, 15.0, 0, 0, 0, 0))
    (g / "metrics_vocoder_01_ramp_256.txt").write_text(stage_page(0, 0, 0, 0, 14.0, 200, 1300, 1450.0) + (
        "vocoder_lane_batch_seconds_sum 3.0\nvocoder_lane_batch_seconds_count 60\nvocoder_lane_batch_size_sum 80\n"
        "vocoder_token_decode_seconds_sum 10.5\nvocoder_generate_seconds_sum 2.75\n"))
    (g / "metrics_vocoder_00_start.txt").write_text(stage_page(99, 9, 9, 9, 0, 0, 0, 0) + (
        "vocoder_lane_batch_seconds_sum 0\nvocoder_lane_batch_seconds_count 0\nvocoder_lane_batch_size_sum 0\n"
        "vocoder_token_decode_seconds_sum 0.7\nvocoder_generate_seconds_sum 0.2\n"))
    row = report.rows(tmp_path)[0]
    work = row["stage_work"]
    assert work["source"] == "scrapes" and "halves" not in work
    assert work["llm_busy"] == 0.4 and work["llm_batch"] == 20 and abs(work["llm_step_ms"] - 12.5) < 1e-9
    assert work["vocoder_busy"] == 0.7 and work["vocoder_windows_per_call"] == 6.5 and work["audio_x_realtime"] == 72.5
    # the playing streams' calls apart from the first-chunk lane's: 140 of 1,220 windows in 11 s, 60 in 3 s
    assert work["playing_calls"] == 140 and abs(work["playing_windows_per_call"] - 1220 / 140) < 1e-9
    assert abs(work["playing_call_ms"] - 11e3 / 140) < 1e-9 and abs(work["lane_call_ms"] - 50.0) < 1e-9
    line = report.work_table([row]).splitlines()[1]
    assert line.split()[2] == "scrapes" and line.rstrip().endswith("-")
    assert "140: 8.7, 78.6 ms" in line and "60: 50.0 ms" in line
    # of the 14 s of calls, the flow's device time 9.8 s and the generator's 2.55 s
    assert abs(work["flow_share"] - 0.7) < 1e-9 and abs(work["generator_share"] - 2.55 / 14) < 1e-9
    assert "70% / 18%" in line
    # a stack without the lane (its counters there, at 0): its cell says so, not "nan ms"
    assert report.lane_cells({"lane_calls": 0.0, "lane_call_ms": math.nan}, "lane") == "0"
    # no stage scrapes either: no row in that table
    for p in g.glob("metrics_[lv]*"):
        p.unlink()
    assert report.rows(tmp_path)[0]["stage_work"] is None
    assert report.work_table(report.rows(tmp_path)) == "(no stage counters)"


def test_the_vocoders_calls_by_their_windows_over_a_load():
    """vocoder_call_seconds_by_windows's growth between the scrapes around a load → each class's calls and mean call;
    None (and no table) for a vocoder that does not count them."""
    def page(counts: dict[str, tuple[int, float]]) -> str:
        return "".join(f'vocoder_call_seconds_by_windows_count{{windows="{k}"}} {n}.0\n'
                       f'vocoder_call_seconds_by_windows_sum{{windows="{k}"}} {t}\n' for k, (n, t) in counts.items())

    before = page({"1-4": (10, 0.4), "5-8": (0, 0.0), "9-16": (3, 0.3), "17-32": (0, 0.0), "33+": (0, 0.0)})
    after = page({"1-4": (30, 1.2), "5-8": (0, 0.0), "9-16": (13, 1.3), "17-32": (4, 0.48), "33+": (0, 0.0)})
    got = report.calls_by_size(before, after)
    assert got["1-4"]["calls"] == 20 and abs(got["1-4"]["mean_seconds"] - 0.04) < 1e-9
    assert got["9-16"]["calls"] == 10 and abs(got["9-16"]["mean_seconds"] - 0.1) < 1e-9
    assert got["17-32"]["calls"] == 4 and abs(got["17-32"]["mean_seconds"] - 0.12) < 1e-9
    assert got["5-8"]["calls"] == 0 and math.isnan(got["5-8"]["mean_seconds"])
    assert report.calls_by_size("", "vocoder_batch_seconds_count 3\n") is None
    text = report.calls_table([{"gateway": "a", "load": "poisson_30", "calls_by_windows": got},
                               {"gateway": "a", "load": "ramp_256", "calls_by_windows": None}])
    head, row = text.splitlines()
    assert head.split()[:3] == ["gateway", "load", "1-4"] and "ramp_256" not in text
    assert "20, 40.0 ms" in row and "10, 100.0 ms" in row and "4, 120.0 ms" in row and " - " in row
    assert report.calls_table([{"gateway": "a", "load": "x", "calls_by_windows": None}]) == ""
