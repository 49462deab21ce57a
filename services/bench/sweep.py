"""`moss-serve bench`: warm-up, then one level per concurrency (or one Poisson level), each measured at the
client; a table on the terminal; bench.json, bench.md and PNG plots in --out."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path

from services.bench import report
from services.bench.encoder_places import PlacesSampler
from services.bench.load import LoadSpec, run_load
from services.bench.stream import JITTER_SECONDS


async def sweep(spec: LoadSpec, concurrencies: list[int], warmup: int, checkpoint=None,
                rates: list[float] | None = None) -> dict:
    """→ {"levels": {label: {"summary", "started_unix", "streams"}}, "capacity"}. Level labels are concurrencies, or "rate R/s" (one
    level of Poisson arrivals per rate, with `rates`). checkpoint(levels) is called after each level (a long sweep cut
    short keeps what it measured)."""
    if warmup:
        await run_load(dataclasses.replace(spec, requests=warmup, concurrency=1, rate=None, progress=False))
    levels = {}
    if rates:
        plan = [(f"rate {rate:g}/s", dataclasses.replace(spec, rate=rate)) for rate in rates]
    else:
        plan = [(c, dataclasses.replace(spec, concurrency=c)) for c in concurrencies]
    for label, level_spec in plan:
        started = time.time()  # (the wall clock, which the stages' metrics sampled beside the bench share)
        places = PlacesSampler(spec.encoder_metrics).start() if spec.encoder_metrics else None
        try:
            records, wall = await run_load(level_spec, label=f"{label} streams" if isinstance(label, int) else label)
        finally:
            held = places.stop() if places else None
        summary = report.summarize(records, wall)
        if held is not None:
            summary["encoder_places"] = held
        first = min((r.sent for r in records), default=0.0)
        levels[label] = {"summary": summary, "started_unix": started,
                         "streams": [r.to_json(level_start=first) for r in records]}
        print(f"{label}: {summary['ok']}/{summary['requests']} ok, TTFA p50 {summary['ttfa_seconds']['p50'] * 1e3:.1f} ms, "
              f"stall-free {summary['stall_free_share'] * 100:.1f}%", file=sys.stderr, flush=True)
        if checkpoint:
            checkpoint(levels)
    by_concurrency = {c: lv["summary"] for c, lv in levels.items() if isinstance(c, int)}
    return {"levels": levels, "capacity": report.capacity(by_concurrency)}


def write(result: dict, out: Path) -> list[Path]:
    """bench.json, bench.md and (matplotlib permitting) the plots."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = {label: lv["summary"] for label, lv in result["levels"].items()}
    paths = [out / "bench.json", out / "bench.md"]
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(
        f"# moss-serve bench, {result['date']}\n\n`{result['command']}`\n\n"
        f"{report.table(summaries, markdown=True)}\n\nMean stage times from the gateway's summaries (ms):\n\n"
        f"{report.stage_table(summaries, markdown=True)}\n\nOffered load and goodput (stall-free streams a second; "
        f"refusals: RESOURCE_EXHAUSTED):\n\n{report.goodput_table(summaries, markdown=True)}\n\n"
        f"{slack_md(summaries)}{turns_md(summaries)}Capacity (≥ {report.CAPACITY_STALL_FREE:.0%} stall-free, "
        f"TTFA p95 ≤ {report.CAPACITY_TTFA_P95 * 1e3:.0f} ms): **{result['capacity']} streams**\n")
    try:
        from services.bench import plots

        paths += plots.draw(result, out)
    except ImportError as err:  # the plots can be drawn later: python -m services.bench.plots bench.json
        print(f"plots skipped ({err}); draw them later with python -m services.bench.plots {paths[0]}", file=sys.stderr)
    return paths


def slack_md(summaries: dict) -> str:
    table = report.slack_table(summaries, markdown=True)
    return (f"Each chunk's slack at the client by its place in its stream (ms; the second chunk's parts: the gateway's "
            f"means):\n\n{table}\n\n" if table else "")


def turns_md(summaries: dict) -> str:
    table = report.turn_table(summaries, markdown=True)
    out = f"Converse sessions, by turn (later turns carry the history):\n\n{table}\n\n" if table else ""
    if barge := report.barge_in_table(summaries, markdown=True):
        out += f"Barge-in by voice (the replies spoken over: their last audio after the new speech began):\n\n{barge}\n\n"
    if places := report.places_table(summaries, markdown=True):
        out += f"The encoder's speaker places in use (sampled every 0.1 s from its /metrics):\n\n{places}\n\n"
    return out


def run(spec: LoadSpec, concurrencies: list[int], warmup: int, out: str | None, command: str,
        rates: list[float] | None = None) -> int:
    def checkpoint(levels: dict) -> None:
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "bench.partial.json").write_text(json.dumps({"levels": levels}) + "\n")

    result = asyncio.run(sweep(spec, concurrencies, warmup, checkpoint, rates))
    result.update(date=datetime.datetime.now().isoformat(timespec="seconds"), command=command, target=spec.target,
                  max_new_tokens=spec.max_new_tokens, reply_seconds=spec.reply_seconds, jitter_seconds=JITTER_SECONDS,
                  prompts=len(spec.prompts), turns=spec.turns, turn_gap=spec.turn_gap)
    summaries = {label: lv["summary"] for label, lv in result["levels"].items()}
    print(report.table(summaries))
    print()
    print(report.stage_table(summaries))
    print()
    print(report.goodput_table(summaries))
    if slack := report.slack_table(summaries):
        print()
        print(slack)
    if turns := report.turn_table(summaries):
        print()
        print(turns)
    if barge := report.barge_in_table(summaries):
        print()
        print(barge)
    if places := report.places_table(summaries):
        print()
        print(places)
    elif spec.encoder_metrics:
        print(f"\nthe encoder's places: {spec.encoder_metrics} could not be read (--encoder-metrics)")
    if not rates:
        print(f"\ncapacity (>= {report.CAPACITY_STALL_FREE:.0%} stall-free, TTFA p95 <= "
              f"{report.CAPACITY_TTFA_P95 * 1e3:.0f} ms): {result['capacity']} streams")
    if out:
        for path in write(result, Path(out)):
            print(f"wrote {path}")
        (Path(out) / "bench.partial.json").unlink(missing_ok=True)
    # Refusals are the service's answer under overload, not a failure of the bench; anything else is
    failed = sum(s["requests"] - s["ok"] - s["refused"] for s in summaries.values())
    return 0 if failed == 0 else 1
