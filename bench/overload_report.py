"""The table of bench/overload.sh's results: per gateway and load, what was offered, admitted and refused, how the
admitted played, and how close to a stall their chunks ran (the slack histogram's share under a few bounds, from the
gateway's metrics before and after the load), and the vocoder's windows with NaN or inf in that load (its metrics'
vocoder_nonfinite_windows_total; "-" for a vocoder that does not count them). Then, per gateway and load, where first
audio went for the admitted streams in TTFA's fastest half and its slowest tenth (the bench's per-stream stages): the
turn's wait for a place and a start slot, the llm's first chunk at the gateway after that, the rest of TTFA (the
vocoder's side: its wait for a call and its call, and the hand-offs), and of it the vocoder's queue. The admission
rule holds TTFA p95, so the slowest tenth is what it sees (docs/benchmarks.md). Last, per gateway and load,
the stages' work: the llm's steps (their batch, their time, the share of the load's time it stepped) and the
vocoder's calls (their windows, their time, the share of the load's time they took: its first-chunk lane and its
playing worker may overlap, so up to 2; of their time, the flow's and the generator's device time), the audio made,
and from bench/timeline.py's half-second samples the share of half seconds in which each stage, and both, were busy
(>= 80%), and of the half seconds in which the gateway refused a turn, the share in which both were (did it refuse
while a stage had time to spare?). Loads measured before the timeline had the stages' counters take them from the
stages' scrapes before and after the load instead ("scrapes": the first load's warm-up turns included; no half
seconds). And the vocoder main worker's calls by their windows (vocoder_call_seconds_by_windows): how many, and their
mean time, per class of size.

    python3 bench/overload_report.py OUT_DIR        # prints the tables, writes OUT_DIR/overload.json
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]  # the tree, bench/
from timeline import CALL_PARTS, LANE, LLM, VOCODER, samples  # noqa: E402

from services.bench.report import slowest_tenth  # noqa: E402

SLACK_BOUNDS = ("0.0", "0.1", "0.3", "0.5")  # le= buckets of gateway_playback_slack_seconds reported
STAGE_COUNTERS = LLM + VOCODER
OPTIONAL_COUNTERS = LANE + CALL_PARTS  # the vocoder's, where the run is recent enough to have them
BUSY = 0.8  # a stage busy in a half second: its steps' or calls' time at least this share of it


def slack_buckets(text: str) -> dict[str, float]:
    """le → cumulative count of gateway_playback_slack_seconds, plus "+Inf"."""
    return {m[1]: float(m[2]) for m in re.finditer(r'^gateway_playback_slack_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)}


def slack_shares(before: str, after: str) -> dict[str, float]:
    """The share of the load's chunks sent with at most each bound of slack."""
    b, a = slack_buckets(before), slack_buckets(after)
    total = a.get("+Inf", 0.0) - b.get("+Inf", 0.0)
    return {f"slack<={le}": (a.get(le, 0.0) - b.get(le, 0.0)) / total if total else math.nan for le in SLACK_BOUNDS}


def nonfinite_windows(text: str) -> float | None:
    """The vocoder's windows with NaN or inf so far, every stage (None: it does not count them)."""
    counts = re.findall(r'^vocoder_nonfinite_windows_total\{stage="[^"]+"\} (\S+)$', text, re.M)
    return sum(map(float, counts)) if counts else None


def call_sums(text: str) -> dict[tuple[str, str], float]:
    """(windows class, "sum" or "count") → vocoder_call_seconds_by_windows's value so far, in the page's order."""
    return {(m[2], m[1]): float(m[3]) for m in re.finditer(
        r'^vocoder_call_seconds_by_windows_(sum|count)\{windows="([^"]+)"\} (\S+)$', text, re.M)}


def calls_by_size(before: str, after: str) -> dict[str, dict[str, float]] | None:
    """The main worker's calls during a load by their windows: class (the vocoder's, in its order) → calls and mean
    seconds (nan for none); None where the vocoder does not count them."""
    b, a = call_sums(before), call_sums(after)
    if not a:
        return None
    out = {}
    for size in dict.fromkeys(size for size, _ in a):
        calls = a.get((size, "count"), 0.0) - b.get((size, "count"), 0.0)
        seconds = a.get((size, "sum"), 0.0) - b.get((size, "sum"), 0.0)
        out[size] = {"calls": calls, "mean_seconds": seconds / calls if calls else math.nan}
    return out


def calls_in(gateway: Path, before: Path, after: Path) -> dict | None:
    if not (pages := stage_scrapes(gateway, before, after, "vocoder")):
        return None
    return calls_by_size(pages[0].read_text(), pages[1].read_text())


def stage_scrapes(gateway: Path, before: Path, after: Path, stage: str) -> tuple[Path, Path] | None:
    """A stage's scrapes taken beside the gateway's two (metrics_<stage>_<k>_<load>.txt), None if either is missing."""
    pages = tuple(gateway / p.name.replace("metrics_", f"metrics_{stage}_", 1) for p in (before, after))
    return pages if all(p.exists() for p in pages) else None


def nonfinite_in(gateway: Path, before: Path, after: Path) -> float | None:
    """Windows with NaN or inf during the load between the gateway's two scrapes (the vocoder's, taken beside them)."""
    if not (pages := stage_scrapes(gateway, before, after, "vocoder")):
        return None
    b, a = pages
    counts = nonfinite_windows(b.read_text()), nonfinite_windows(a.read_text())
    return None if None in counts else counts[1] - counts[0]


def mean(values) -> float:
    """The mean of the values that are there (None: a stage not reported), nan if none is."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else math.nan


def ttfa_bands(streams: list[dict]) -> dict[str, dict[str, float]]:
    """The admitted streams' stages by TTFA band → band → means in seconds: ttfa, admission (the turn's wait for a place
    and a start slot; 0 before the bench recorded it), llm (its first chunk at the gateway, after admission),
    vocoder_side (TTFA less those), vocoder_queue (a first chunk's wait in the vocoder; nan where not reported)."""
    ok = sorted((x["stages"] for x in streams if x.get("code") == "OK" and "ttfa_seconds" in x.get("stages", {})),
                key=lambda st: st["ttfa_seconds"])
    bands = {"fastest half": ok[: max(1, len(ok) // 2)] if ok else [],
             "slowest tenth": slowest_tenth(ok, ttfa=lambda st: st["ttfa_seconds"])}  # the bench's own tenth
    def waited(st: dict) -> float:
        return st.get("admission_wait_seconds", 0.0)
    return {name: {"streams": len(part), "ttfa": mean([st["ttfa_seconds"] for st in part]),
                   "admission": mean([waited(st) for st in part]),
                   "llm": mean([st["llm_first_chunk_seconds"] - waited(st) for st in part
                                if st.get("llm_first_chunk_seconds") is not None]),
                   "vocoder_side": mean([st["ttfa_seconds"] - st["llm_first_chunk_seconds"] for st in part
                                         if st.get("llm_first_chunk_seconds") is not None]),
                   "vocoder_queue": mean([st.get("vocoder_first_chunk_queue_seconds") for st in part])}
            for name, part in bands.items()}


def turns_and_limit(streams: list[dict]) -> dict[str, float]:
    """How long the admitted turns ran at the client (sent to their last chunk: p50, seconds) and the admission limit
    as the client saw it: the turns running when each refusal (RESOURCE_EXHAUSTED) came (the most, and at the last;
    nan without refusals). A limit that climbs through a load, or turns that run longer, show here first (docs/benchmarks.md,
    2026-12-02)."""
    played = [(x["sent_s"], x["sent_s"] + x["chunk_arrivals_s"][-1]) for x in streams
              if x.get("code") == "OK" and x.get("chunk_arrivals_s") and "sent_s" in x]
    lasted = sorted(end - sent for sent, end in played)
    running = [sum(1 for sent, end in played if sent <= t < end)
               for t in sorted(x["sent_s"] for x in streams if x.get("code") == "RESOURCE_EXHAUSTED" and "sent_s" in x)]
    return {"turn_p50": lasted[len(lasted) // 2] if lasted else math.nan,
            "running_at_refusals_max": max(running) if running else math.nan,
            "running_at_last_refusal": running[-1] if running else math.nan}


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def stage_work(growth: dict[str, float], seconds: float) -> dict[str, float]:
    """The stages' counters' growth over `seconds` of a load → how busy each stage was, and with what."""
    def d(name: str) -> float:
        return growth.get(name, math.nan)
    steps, calls, called = d("llm_step_seconds_count"), d("vocoder_batch_seconds_count"), d("vocoder_batch_seconds_sum")
    return {"seconds": seconds, "llm_steps": steps, "llm_batch": ratio(d("llm_batch_size_sum"), steps),
            "llm_step_ms": ratio(d("llm_step_seconds_sum"), steps) * 1e3, "llm_busy": ratio(d("llm_step_seconds_sum"), seconds),
            "vocoder_calls": calls, "vocoder_windows_per_call": ratio(d("vocoder_batch_size_sum"), calls),
            "vocoder_call_ms": ratio(called, calls) * 1e3, "vocoder_busy": ratio(called, seconds),
            "audio_x_realtime": ratio(d("vocoder_audio_seconds_total"), seconds),
            "audio_per_vocoder_second": ratio(d("vocoder_audio_seconds_total"), called),
            # the playing streams' calls apart from the first-chunk lane's (NaN where the counters predate them)
            **lane_split(calls, called, d("vocoder_batch_size_sum"), d("vocoder_lane_batch_seconds_count"),
                         d("vocoder_lane_batch_seconds_sum"), d("vocoder_lane_batch_size_sum")),
            # of the calls' time, the flow's and the generator's device time (NaN where the counters predate them)
            "flow_share": ratio(d("vocoder_token_decode_seconds_sum"), called),
            "generator_share": ratio(d("vocoder_generate_seconds_sum"), called)}


def lane_split(calls: float, called: float, windows: float, lane_calls: float, lane_called: float,
               lane_windows: float) -> dict[str, float]:
    """The vocoder's calls, their seconds and windows (all of them, and the lane's) → the playing streams' and the
    lane's calls, windows a call and ms a call."""
    playing = calls - lane_calls
    return {"playing_calls": playing, "playing_windows_per_call": ratio(windows - lane_windows, playing),
            "playing_call_ms": ratio(called - lane_called, playing) * 1e3, "lane_calls": lane_calls,
            "lane_call_ms": ratio(lane_called, lane_calls) * 1e3}


def read_timeline(path: Path) -> list[dict[str, float]]:
    """bench/timeline.py's rows, each with the columns it has a value for (an older timeline: the gateway's only)."""
    if not path.exists():
        return []
    lines = [line.split("\t") for line in path.read_text().splitlines()]
    rows_, head = [], None
    for cells in lines:
        if cells[0] == "t":  # a header (one per load() of overload.sh, the same columns)
            head = cells
        elif head is not None:
            rows_.append({name: float(v) for name, v in zip(head, cells) if v})
    return rows_


def timeline_work(timeline: list[dict[str, float]], start: float, end: float, refused: list[float] = ()) -> dict | None:
    """The stages' work from the last sample at or before `start` to the first at or after `end`, the share of its half
    seconds in which each stage was busy, and how many half seconds held a refusal (`refused`: when each refused turn
    was sent, on the wall clock) and the share of those in which both were; None if the timeline does not cover the
    load with their counters."""
    samples = [r for r in timeline if all(name in r for name in STAGE_COUNTERS)]
    before = [r for r in samples if r["t"] <= start]
    after = [r for r in samples if r["t"] >= end]
    if not (before and after):
        return None
    span = [r for r in samples if before[-1]["t"] <= r["t"] <= after[0]["t"]]
    counters = STAGE_COUNTERS + tuple(n for n in OPTIONAL_COUNTERS if n in before[-1] and n in after[0])
    work = stage_work({n: after[0][n] - before[-1][n] for n in counters}, after[0]["t"] - before[-1]["t"])
    halves = [(ratio(b["llm_step_seconds_sum"] - a["llm_step_seconds_sum"], b["t"] - a["t"]),
               ratio(b["vocoder_batch_seconds_sum"] - a["vocoder_batch_seconds_sum"], b["t"] - a["t"]),
               any(a["t"] <= t < b["t"] for t in refused))
              for a, b in zip(span, span[1:])]
    both = [llm >= BUSY and voc >= BUSY for llm, voc, _ in halves]
    refusing = [busy for busy, (_, _, refusal) in zip(both, halves) if refusal]
    work |= {"source": "timeline", "halves": len(halves),
             "halves_llm_busy": ratio(sum(llm >= BUSY for llm, _, _ in halves), len(halves)),
             "halves_vocoder_busy": ratio(sum(voc >= BUSY for _, voc, _ in halves), len(halves)),
             "halves_both_busy": ratio(sum(both), len(halves)),
             "refusal_halves": len(refusing), "refusal_halves_both_busy": ratio(sum(refusing), len(refusing))}
    return work


def scrapes_work(gateway: Path, before: Path, after: Path, seconds: float) -> dict | None:
    """The stages' work from their scrapes beside the gateway's before and after the load, over its wall seconds."""
    growth = {}
    for stage, names in (("llm", LLM), ("vocoder", VOCODER + OPTIONAL_COUNTERS)):
        if not (pages := stage_scrapes(gateway, before, after, stage)):
            return None
        b, a = (samples(p.read_text(), names) for p in pages)
        growth |= {n: a[n] - b[n] for n in a if n in b}
    return stage_work(growth, seconds) | {"source": "scrapes"}


def level_work(level: dict, timeline: list[dict[str, float]], gateway: Path, before: Path, after: Path) -> dict | None:
    """A load's stage work: over its own wall time from the timeline where it has the stages' counters and bench.json
    the load's start on the wall clock, else from the stages' scrapes around it."""
    wall = level["summary"].get("wall_seconds", math.nan)
    if "started_unix" in level:
        start = level["started_unix"]
        refused = [start + x["sent_s"] for x in level.get("streams", []) if x.get("code") == "RESOURCE_EXHAUSTED"]
        if work := timeline_work(timeline, start, start + wall, refused):
            return work
    return scrapes_work(gateway, before, after, wall)


def rows(out: Path) -> list[dict]:
    result = []
    for gateway in sorted(p for p in out.iterdir() if p.is_dir()):
        scrapes = sorted(gateway.glob("metrics_[0-9]*.txt"))  # the gateway's (metrics_llm_*, metrics_vocoder_*: beside)
        timeline = read_timeline(gateway / "timeline.tsv")
        for before, after in zip(scrapes, scrapes[1:]):
            run = gateway / after.stem.split("_", 2)[2] / "bench.json"  # metrics_<k>_<run dir>
            if not run.exists():
                continue
            levels = json.loads(run.read_text())["levels"]
            shares = slack_shares(before.read_text(), after.read_text())
            for label, level in levels.items():
                s = level["summary"]
                result.append({"gateway": gateway.name, "load": f"{run.parent.name}", "requests": s["requests"],
                               "admitted": s["ok"], "refused": s["refused"], "other_errors": s["requests"] - s["ok"] - s["refused"],
                               "stall_free_share": s["stall_free_share"], "ttfa_p50": s["ttfa_seconds"]["p50"],
                               "ttfa_p95": s["ttfa_seconds"]["p95"], "offered_per_second": s["offered_per_second"],
                               "goodput_per_second": s["goodput_per_second"], "refusal_max": s["refusal_seconds"]["max"],
                               "audio_x_realtime_offered": s.get("audio_x_realtime_offered", math.nan),
                               "refusals_with_hint": s["refusals_with_hint"],
                               "nonfinite_windows": nonfinite_in(gateway, before, after), **shares,
                               "ttfa_bands": ttfa_bands(level.get("streams", [])),
                               **turns_and_limit(level.get("streams", [])),
                               "calls_by_windows": calls_in(gateway, before, after),
                               "stage_work": level_work(level, timeline, gateway, before, after)})
    return result


def columns(lines: list[list[str]]) -> str:
    """A header row and data rows → left-aligned columns."""
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in lines)


def table(result: list[dict]) -> str:
    head = ["gateway", "load", "req", "admitted", "refused", "errors", "stall-free", "TTFA p50", "TTFA p95", "offered/s",
            "goodput/s", "xRT offered", "refusal max", "NaN windows", "turn p50", "running at refusals: most, last",
            *(f"slack<={b}" for b in SLACK_BOUNDS)]
    lines = [head]
    for r in result:
        lines.append([r["gateway"], r["load"], str(r["requests"]), str(r["admitted"]), str(r["refused"]), str(r["other_errors"]),
                      f"{r['stall_free_share'] * 100:.1f}%", f"{r['ttfa_p50'] * 1e3:.0f} ms", f"{r['ttfa_p95'] * 1e3:.0f} ms",
                      f"{r['offered_per_second']:.1f}", f"{r['goodput_per_second']:.1f}",
                      f"{r.get('audio_x_realtime_offered', math.nan):.0f}",
                      f"{r['refusal_max'] * 1e3:.0f} ms" if r["refused"] else "-",
                      "-" if r.get("nonfinite_windows") is None else f"{r['nonfinite_windows']:.0f}",
                      f"{r.get('turn_p50', math.nan):.2f} s", limit_cell(r),
                      *(f"{r.get(f'slack<={b}', math.nan) * 100:.1f}%" for b in SLACK_BOUNDS)])
    return columns(lines)


def limit_cell(r: dict) -> str:
    most, last = r.get("running_at_refusals_max", math.nan), r.get("running_at_last_refusal", math.nan)
    return "-" if math.isnan(most) else f"{most:.0f}, {last:.0f}"


def bands_table(result: list[dict]) -> str:
    """Where first audio went, per gateway, load and TTFA band (ms)."""
    head = ["gateway", "load", "band", "streams", "TTFA", "admission wait", "llm first chunk", "vocoder side", "its queue"]
    lines = [head]
    parts = ("ttfa", "admission", "llm", "vocoder_side", "vocoder_queue")
    for r in result:
        for band, b in r.get("ttfa_bands", {}).items():
            lines.append([r["gateway"], r["load"], band, str(b["streams"]),
                          *(f"{b[k] * 1e3:.1f} ms" for k in parts)])
    return columns(lines)


def lane_cells(w: dict, part: str) -> str:
    """The playing streams' calls (count: windows each, ms each) or the lane's (count: ms each); "-" without them."""
    if math.isnan(w.get(f"{part}_calls", math.nan)):
        return "-"
    if not w[f"{part}_calls"]:
        return "0"  # (the lane off)
    windows = f"{w['playing_windows_per_call']:.1f}, " if part == "playing" else ""
    return f"{w[f'{part}_calls']:.0f}: {windows}{w[f'{part}_call_ms']:.1f} ms"


def part_cells(w: dict) -> str:
    """The flow's and the generator's shares of the calls' time ("-" without their counters)."""
    flow, generator = w.get("flow_share", math.nan), w.get("generator_share", math.nan)
    return "-" if math.isnan(flow) or math.isnan(generator) else f"{flow * 100:.0f}% / {generator * 100:.0f}%"


def work_table(result: list[dict]) -> str:
    """The stages' work per gateway and load."""
    head = ["gateway", "load", "from", "seconds", "llm steps", "batch", "step", "llm busy", "vocoder calls", "windows",
            "call", "playing calls: windows, call", "lane calls: call", "of the calls: flow / generator", "vocoder busy",
            "audio xRT",
            "audio per call-second", "half seconds: llm / vocoder / both busy", "with a refusal: both busy"]
    lines = [head]
    for r in result:
        if not (w := r.get("stage_work")):
            continue
        timeline = w["source"] == "timeline"
        halves = "/".join(f"{w[k] * 100:.0f}%" for k in ("halves_llm_busy", "halves_vocoder_busy", "halves_both_busy")) \
            if timeline else "-"
        refusing = f"{w['refusal_halves_both_busy'] * 100:.0f}% of {w['refusal_halves']}" \
            if timeline and w["refusal_halves"] else "-"
        lines.append([r["gateway"], r["load"], w["source"], f"{w['seconds']:.1f}", f"{w['llm_steps']:.0f}",
                      f"{w['llm_batch']:.1f}", f"{w['llm_step_ms']:.1f} ms", f"{w['llm_busy'] * 100:.0f}%",
                      f"{w['vocoder_calls']:.0f}", f"{w['vocoder_windows_per_call']:.1f}", f"{w['vocoder_call_ms']:.1f} ms",
                      lane_cells(w, "playing"), lane_cells(w, "lane"), part_cells(w), f"{w['vocoder_busy'] * 100:.0f}%",
                      f"{w['audio_x_realtime']:.0f}", f"{w['audio_per_vocoder_second']:.0f}", halves, refusing])
    return columns(lines) if len(lines) > 1 else "(no stage counters)"


def calls_table(result: list[dict]) -> str:
    """The vocoder main worker's calls by their windows, per gateway and load: calls, mean ms (what one more window
    costs in the stack; "-" for a class with none), for the loads whose vocoder counts them; "" if none does."""
    counted = [r for r in result if r.get("calls_by_windows")]
    if not counted:
        return ""
    sizes = list(dict.fromkeys(size for r in counted for size in r["calls_by_windows"]))
    lines = [["gateway", "load", *(f"{size} windows" for size in sizes)]]
    for r in counted:
        c = r["calls_by_windows"]
        lines.append([r["gateway"], r["load"], *("-" if not c.get(k, {}).get("calls") else
                                                 f"{c[k]['calls']:.0f}, {c[k]['mean_seconds'] * 1e3:.1f} ms"
                                                 for k in sizes)])
    return columns(lines)


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path("/tmp/out")
    result = rows(out)
    print(table(result))
    print()
    print(bands_table(result))
    print()
    print(work_table(result))
    if calls := calls_table(result):
        print()
        print(calls)
    (out / "overload.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
