"""A level's streams → its figures; a sweep's levels → the capacity; tables for the terminal and markdown."""

from __future__ import annotations

import math
from collections import Counter

from services.bench.stream import JITTER_SECONDS, StreamRecord

QUANTILES = (50, 90, 95, 99)
# docs/architecture.md §5: capacity is the most concurrent streams with ≥ 99% stall-free and TTFA p95 ≤ 300 ms.
CAPACITY_STALL_FREE = 0.99
CAPACITY_TTFA_P95 = 0.300
# The gateway's summary fields averaged per level (a spoken turn's ttfa runs from its speech's end).
STAGES = ("encoder_finish_seconds", "admission_wait_seconds", "llm_queue_seconds", "llm_prefill_seconds",
          "llm_first_chunk_in_llm_seconds", "llm_first_chunk_seconds", "vocoder_first_chunk_queue_seconds",
          "vocoder_first_chunk_seconds", "vocoder_first_chunk_in_vocoder_seconds", "ttfa_seconds", "total_seconds")

# A chunk's slack (how early it came before its listener would have run out; < 0: late) by its place in its stream:
# the second chunk, which the listener waits for with the first one's audio only, and under load the one whose slack
# the gateway's admission limit falls on (docs/admission.md); the third; every later one.
SLACK_PLACES = ("2nd", "3rd", "later")
LOW_SLACK = 0.05  # seconds: the headroom rule's low_slack (services/gateway/headroom.py)
# The gateway's parts of the second chunk (SynthesisSummary), averaged per level.
SECOND_CHUNK_STAGES = ("llm_second_chunk_seconds", "vocoder_second_chunk_in_vocoder_seconds",
                       "vocoder_second_chunk_queue_seconds")


def quantile(values: list[float], q: float) -> float:
    """The q-th percentile, linear between order statistics (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(records: list[StreamRecord], wall: float, jitter: float = JITTER_SECONDS) -> dict:
    """One level's figures. Streams that failed count in `requests` and `errors`, not in the latency figures.
    Goodput: offered load is the requests over the time they were sent in; goodput the stall-free streams
    over the level's wall time; refusals (RESOURCE_EXHAUSTED) are timed from sending to the status, and counted with
    and without a retry hint."""
    ok = [r for r in records if r.ok]
    ttfa = [r.ttfa for r in ok]
    rtf = [r.rtf for r in ok]
    stalls = [s for r in ok for s in r.stalls(jitter)]
    stall_free = sum(r.stall_free(jitter) for r in ok)
    audio = sum(r.audio_seconds for r in ok)
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": dict(Counter(r.code for r in records if not r.ok)),
        "wall_seconds": wall,
        "audio_seconds": audio,
        "audio_x_realtime": audio / wall if wall > 0 else math.nan,
        "ttfa_seconds": {f"p{q}": quantile(ttfa, q) for q in QUANTILES} | {"mean": _mean(ttfa)},
        "rtf": {f"p{q}": quantile(rtf, q) for q in QUANTILES} | {"mean": _mean(rtf)},
        "stall_free_streams": stall_free,
        "stall_free_share": stall_free / len(ok) if ok else 0.0,
        "stalls": len(stalls),
        "stall_seconds": {"total": sum(stalls), "max": max(stalls, default=0.0)},
        "stages_mean_seconds": stage_means(ok),
        "stages_slowest_tenth_seconds": stage_means(slowest_tenth(ok)),
        "slack_by_place": slack_by_place(ok),
        "second_chunk_mean_seconds": {s: _mean([r.stages[s] for r in ok if r.stages.get(s)]) for s in SECOND_CHUNK_STAGES},
        "by_turn": by_turn(ok),
        "barge_in": barge_in(records),
        **goodput(records, wall, stall_free),
    }


def barge_in(records: list[StreamRecord]) -> dict:
    """Replies spoken over (moss-serve bench --barge-in): how many, how long after the new speech began their last
    audio still arrived at the client (negative: none came after it), and their TurnCancelled (p50 / p95 / max; {}
    where none was)."""
    over = [r for r in records if r.barged_in is not None]
    if not over:
        return {}

    def spread(values: list[float]) -> dict:
        return {"p50": quantile(values, 50), "p95": quantile(values, 95), "max": max(values, default=math.nan)}

    return {"replies": len(over), "stop_seconds": spread([r.barged_in for r in over]),
            "cancelled_seconds": spread([r.cancelled_after for r in over if r.cancelled_after is not None])}


def barge_in_table(levels: dict, markdown: bool = False) -> str:
    """Per level with barge-ins: replies spoken over, their last audio and their cancel after the new speech began."""
    rows = [["streams", "replies spoken over", "last audio after: p50", "p95", "max", "cancelled after: p50", "p95"]]
    for c, lv in levels.items():
        if b := lv.get("barge_in"):
            t, x = b["stop_seconds"], b["cancelled_seconds"]
            rows.append([str(c), str(b["replies"]), *(f"{t[k] * 1e3:.0f} ms" for k in ("p50", "p95", "max")),
                         *(f"{x[k] * 1e3:.0f} ms" for k in ("p50", "p95"))])
    return _format(rows, markdown) if len(rows) > 1 else ""


def places_table(levels: dict, markdown: bool = False) -> str:
    """Per level sampled (encoder_places.py): the encoder's speaker places in use, at the most and on average, of all."""
    rows = [["streams", "encoder places in use: peak", "mean", "of"]]
    for c, lv in levels.items():
        if p := lv.get("encoder_places"):
            rows.append([str(c), f"{p['peak']:.0f}", f"{p['mean']:.1f}", f"{p['of']:.0f}"])
    return _format(rows, markdown) if len(rows) > 1 else ""


def stage_means(records: list[StreamRecord]) -> dict:
    return {s: _mean([r.stages[s] for r in records if s in r.stages]) for s in STAGES}


def slack_by_place(ok: list[StreamRecord]) -> dict[str, dict]:
    """Each chunk's slack at the client by its place in its stream (SLACK_PLACES) → per place: chunks, p2 / p10 / p50
    in seconds, and how many came with less than LOW_SLACK to spare."""
    by: dict[str, list[float]] = {place: [] for place in SLACK_PLACES}
    for r in ok:
        for i, late in enumerate(r.lateness()[1:], start=1):
            by[SLACK_PLACES[min(i, len(SLACK_PLACES)) - 1]].append(-late)
    return {place: {"chunks": len(v), **{f"p{q}": quantile(v, q) for q in (2, 10, 50)},
                    "under_low_slack": sum(x < LOW_SLACK for x in v)} for place, v in by.items()}


def slack_table(levels: dict, markdown: bool = False) -> str:
    """Per level and chunk place: the chunks' slack at the client (ms), and for the second chunk the gateway's means of
    its parts: the llm's second chunk after its first, the vocoder's time for it and its wait for a call."""
    rows = [["streams", "chunk", "chunks", "slack p2", "p10", "p50", f"under {LOW_SLACK * 1e3:.0f} ms",
             "llm after the first", "vocoder", "vocoder queue"]]
    for c, lv in levels.items():
        means = lv.get("second_chunk_mean_seconds", {})
        for place, fig in lv.get("slack_by_place", {}).items():
            if not fig["chunks"]:
                continue
            parts = [f"{means[s] * 1e3:.1f}" if place == SLACK_PLACES[0] and not math.isnan(means.get(s, math.nan))
                     else "-" for s in SECOND_CHUNK_STAGES]
            rows.append([str(c), place, str(fig["chunks"]), *(f"{fig[q] * 1e3:.0f}" for q in ("p2", "p10", "p50")),
                         str(fig["under_low_slack"]), *parts])
    return _format(rows, markdown) if len(rows) > 1 else ""


def slowest_tenth(ok: list, ttfa=lambda r: r.ttfa) -> list:
    """The tenth of the streams with the longest time to first audio (`ttfa` of a stream; by default a StreamRecord's,
    at the client), at least one: where a level's stage means and its tail part, the stage that makes the tail shows
    (docs/benchmarks.md). bench/overload_report.py takes the same tenth of a bench.json's streams."""
    return sorted(ok, key=ttfa)[-math.ceil(len(ok) / 10):] if ok else []


def goodput(records: list[StreamRecord], wall: float, stall_free: int) -> dict:
    sent = [r.sent for r in records]
    first, last = (min(sent), max(sent)) if sent else (0.0, 0.0)
    span = last - first
    refused = [r for r in records if r.refused]
    waits = [r.done - r.sent for r in refused if r.done]
    audio_offered = sum(n / r.sample_rate for r in records if r.ok for at, n in r.chunks if first <= at <= last)
    return {
        # n sends span n − 1 gaps: over (n − 1) / span, a steady rate reads as itself
        "offered_per_second": (len(sent) - 1) / span if span > 0 else math.nan,
        "goodput_per_second": stall_free / wall if wall > 0 else math.nan,
        # audio received a second while the load was offered (first send to last): what the stack makes at that
        # load, which audio_x_realtime (over the wall time, the tail of the last replies included) understates;
        # a steady load of replies of R seconds at a rate of Q a second needs Q x R of it
        "audio_x_realtime_offered": audio_offered / span if span > 0 else math.nan,
        "refused": len(refused),
        "refusal_seconds": {"p50": quantile(waits, 50), "p95": quantile(waits, 95), "max": max(waits, default=math.nan)},
        "refusals_with_hint": sum(r.retry_after is not None for r in refused),
    }


def by_turn(ok: list[StreamRecord]) -> dict[int, dict]:
    """Converse sessions: each turn number's TTFA, prefill and prompt (later turns carry the history, most of it
    cached in the llm) → {turn: figures}; {} for Synthesize calls."""
    turns = sorted({r.turn for r in ok if r.turn})
    out = {}
    for turn in turns:
        rs = [r for r in ok if r.turn == turn]
        ttfa = [r.ttfa for r in rs]
        out[turn] = {"turns": len(rs), "ttfa_p50": quantile(ttfa, 50), "ttfa_p95": quantile(ttfa, 95),
                     "prefill_mean": _mean([r.stages.get("llm_prefill_seconds", math.nan) for r in rs]),
                     "prompt_tokens_mean": _mean([r.stages.get("prompt_tokens", math.nan) for r in rs]),
                     "stall_free_share": sum(r.stall_free() for r in rs) / len(rs)}
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def meets_capacity(level: dict) -> bool:
    return (level["ok"] == level["requests"] > 0 and level["stall_free_share"] >= CAPACITY_STALL_FREE
            and level["ttfa_seconds"]["p95"] <= CAPACITY_TTFA_P95)


def capacity(levels: dict[int, dict]) -> int:
    """The largest concurrency whose level meets the bar (0: none did). Levels above a failing one still
    count if they pass: the sweep reports what it measured."""
    return max((c for c, lv in levels.items() if meets_capacity(lv)), default=0)


HEADER = ("streams", "ok", "errors", "TTFA p50", "p90", "p95", "p99", "RTF p50", "RTF p95", "stall-free", "stalls",
          "audio xRT")


def row(concurrency: int | str, lv: dict) -> list[str]:
    t, r = lv["ttfa_seconds"], lv["rtf"]
    errors = ", ".join(f"{k} {v}" for k, v in sorted(lv["errors"].items())) or "0"
    return [str(concurrency), str(lv["ok"]), errors, *(f"{t[f'p{q}'] * 1e3:.1f} ms" for q in QUANTILES),
            f"{r['p50']:.3f}", f"{r['p95']:.3f}", f"{lv['stall_free_share'] * 100:.1f}%", str(lv["stalls"]),
            f"{lv['audio_x_realtime']:.1f}"]


def table(levels: dict, markdown: bool = False) -> str:
    return _format([list(HEADER)] + [row(c, lv) for c, lv in levels.items()], markdown)


def stage_table(levels: dict, markdown: bool = False) -> str:
    """Mean per-stage times from the gateway's summaries, per level, in ms: over all its streams, then over the tenth
    whose first audio came last."""
    rows = [["streams", *(s.removesuffix("_seconds") for s in STAGES)]]
    for c, lv in levels.items():
        for label, means in ((str(c), lv["stages_mean_seconds"]), (f"{c}, slowest 10%", lv["stages_slowest_tenth_seconds"])):
            rows.append([label, *(f"{means[s] * 1e3:.1f}" for s in STAGES)])
    return _format(rows, markdown)


def _format(rows: list[list[str]], markdown: bool) -> str:
    """A header row and data rows → a markdown table, or right-aligned columns for the terminal."""
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows)


def goodput_table(levels: dict, markdown: bool = False) -> str:
    """Per level: offered load and goodput (a second), audio made a second while the load was offered (x real time),
    the stall-free share, refusals with their time to answer and how many carried a retry hint."""
    rows = [["streams", "offered/s", "goodput/s", "audio xRT offered", "stall-free", "refused", "refusal p95", "with hint"]]
    for c, lv in levels.items():
        p95 = lv["refusal_seconds"]["p95"]
        rows.append([str(c), f"{lv['offered_per_second']:.1f}", f"{lv['goodput_per_second']:.1f}",
                     f"{lv.get('audio_x_realtime_offered', math.nan):.1f}",
                     f"{lv['stall_free_share'] * 100:.1f}%", str(lv["refused"]),
                     f"{p95 * 1e3:.1f} ms" if lv["refused"] else "-",
                     f"{lv['refusals_with_hint']}/{lv['refused']}" if lv["refused"] else "-"])
    return _format(rows, markdown)


def turn_table(levels: dict, markdown: bool = False) -> str:
    """Converse levels: per turn number, TTFA p50/p95, mean prefill (ms) and prompt tokens, stall-free share."""
    rows = [["streams", "turn", "turns", "TTFA p50", "TTFA p95", "prefill", "prompt tokens", "stall-free"]]
    for c, lv in levels.items():
        for turn, t in lv.get("by_turn", {}).items():
            rows.append([str(c), str(turn), str(t["turns"]), f"{t['ttfa_p50'] * 1e3:.1f} ms", f"{t['ttfa_p95'] * 1e3:.1f} ms",
                         f"{t['prefill_mean'] * 1e3:.1f} ms", f"{t['prompt_tokens_mean']:.0f}",
                         f"{t['stall_free_share'] * 100:.1f}%"])
    return _format(rows, markdown) if len(rows) > 1 else ""
