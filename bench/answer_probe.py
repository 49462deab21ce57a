"""Seconds from a moment (a kill, a fault) to the first turn the gateway answers, tried again and again from one
process: each try a short Synthesize with a short deadline, the next 0.2 s after one fails. bench/restart.sh's "`say`
answered" column was a new `moss-serve say` process a try (1-2 s of imports each) with a 15 s deadline, so a try
begun while the stages were down could end just before they were back, and the column lagged the load's first audio
by 1-7 s (docs/benchmarks.md, fault-2026-11-30).

    python3 bench/answer_probe.py --since UNIX_TIME [--target 127.0.0.1:50051] [--limit 150] [--try-seconds 3]

Prints the seconds (two decimals), or "null" if no turn was answered within --limit seconds of --since.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "protos")]
from moss.speech.v1 import common_pb2  # noqa: E402

from services.gateway.client import synthesize  # noqa: E402

PAUSE = 0.2  # seconds between a failed try and the next


async def first_answer(target: str, since: float, limit: float, try_seconds: float) -> float | None:
    """Seconds after `since` (unix time) when a turn's reply first ended OK, or None past `limit`."""
    sampling = common_pb2.SamplingParams(max_new_tokens=8, min_new_tokens=8)
    while time.time() - since < limit:
        try:
            await synthesize(target, "after the restart", sampling=sampling, timeout=try_seconds)
            return time.time() - since
        except Exception:  # noqa: BLE001  (down, refused, or past the try's deadline: try again)
            await asyncio.sleep(PAUSE)
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--since", type=float, required=True, help="unix time to count from")
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--limit", type=float, default=150.0)
    p.add_argument("--try-seconds", type=float, default=3.0)
    args = p.parse_args()
    seconds = asyncio.run(first_answer(args.target, args.since, args.limit, args.try_seconds))
    print("null" if seconds is None else f"{seconds:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
