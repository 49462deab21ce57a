"""bench/rolling.sh's table: the turns of a load around a rolling restart, by how they ended.

    python3 bench/rolling_report.py BENCH_JSON --hup UNIX --done UNIX|null [--json rolling.json]

BENCH_JSON is the load's (`moss-serve bench --rate ...`); HUP the SIGHUP's time and DONE when up said the round was
over (null: it never did), both seconds since the epoch. Turns, by when they were sent: running at the SIGHUP (sent
before, ended after), sent during the restart, sent after it. For each: how many, refused (RESOURCE_EXHAUSTED: not
admitted), failed (admitted and ended other than OK: what a rolling restart must not do), their codes, the share of
the answered that played stall-free, and TTFA at the client.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

from services.bench.stream import StreamRecord


def records(level: dict) -> list[StreamRecord]:
    """A level's streams (bench.json) → records on the level's clock (seconds since it started)."""
    out = []
    for s in level["streams"]:
        sent = s["sent_s"]
        out.append(StreamRecord(sent=sent, code=s["code"], error=s["error"], sample_rate=s["sample_rate"],
                                chunks=[(sent + t, n) for t, n in zip(s["chunk_arrivals_s"], s["chunk_samples"])],
                                done=sent + s["done_s"] if s.get("done_s") is not None else sent))
    return out


def summary(rs: list[StreamRecord]) -> dict:
    answered = [r for r in rs if r.ok]
    failed = [r for r in rs if not r.refused and not r.ok]
    ttfas = sorted(r.ttfa for r in answered)
    return {"turns": len(rs), "refused": sum(r.refused for r in rs), "failed": len(failed),
            "failed_codes": dict(Counter(r.code for r in failed)),
            "failed_errors": sorted({r.error[:160] for r in failed})[:5],
            "answered": len(answered),
            "stall_free_share": sum(r.stall_free() for r in answered) / len(answered) if answered else None,
            "ttfa_p50_s": statistics.median(ttfas) if ttfas else None,
            "ttfa_p95_s": ttfas[min(len(ttfas) - 1, int(0.95 * len(ttfas)))] if ttfas else None}


def report(bench: dict, hup: float, done: float | None) -> dict:
    (name, level), = bench["levels"].items()
    start = level["started_unix"]
    at, until = hup - start, (done - start if done is not None else None)
    rs = records(level)
    end = until if until is not None else float("inf")
    groups = {
        "running at the SIGHUP": [r for r in rs if r.sent < at <= r.done],
        "sent during the restart": [r for r in rs if at <= r.sent <= end],
        "sent after it": [r for r in rs if r.sent > end],
    }
    return {"load": name, "sighup_s": round(at, 2), "restart_seconds": round(until - at, 1) if until is not None else None,
            **{group: summary(members) for group, members in groups.items()}, "whole load": summary(rs)}


def table(out: dict) -> str:
    lines = [f"{out['load']}: SIGHUP {out['sighup_s']} s into the load; the round took "
             + (f"{out['restart_seconds']} s" if out["restart_seconds"] is not None else "longer than the load (no end seen)"),
             "", "| turns | sent | refused | failed (admitted, not OK) | answered | stall-free | TTFA p50 / p95 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for group in ("running at the SIGHUP", "sent during the restart", "sent after it", "whole load"):
        s = out[group]
        share = f"{s['stall_free_share'] * 100:.1f}%" if s["stall_free_share"] is not None else "-"
        ttfa = (f"{s['ttfa_p50_s'] * 1e3:.0f} / {s['ttfa_p95_s'] * 1e3:.0f} ms" if s["ttfa_p50_s"] is not None else "-")
        failed = f"{s['failed']}" + (f" {s['failed_codes']}" if s["failed"] else "")
        lines.append(f"| {group} | {s['turns']} | {s['refused']} | {failed} | {s['answered']} | {share} | {ttfa} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json")
    parser.add_argument("--hup", type=float, required=True)
    parser.add_argument("--done", required=True, help="seconds since the epoch, or null")
    parser.add_argument("--json")
    args = parser.parse_args()
    out = report(json.loads(Path(args.bench_json).read_text()), args.hup,
                 None if args.done == "null" else float(args.done))
    print(table(out))
    for group in ("running at the SIGHUP", "sent during the restart", "sent after it"):
        for error in out[group]["failed_errors"]:
            print(f"  {group}, failed: {error}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
