"""Seconds from a moment (a kill, a fault) to the first turn the gateway answers, tried again and again from one
process: each try a short Synthesize with a short deadline, the next 0.2 s after one fails. bench/restart.sh's "`say`
answered" column was a new `moss-serve say` process a try (1-2 s of imports each) with a 15 s deadline, so a try
begun while the stages were down could end just before they were back, and the column lagged the load's first audio
by 1-7 s (docs/benchmarks.md, fault-2026-11-30).

    python3 bench/answer_probe.py --since UNIX_TIME [--target 127.0.0.1:50051] [--limit 150] [--try-seconds 3]

Prints the seconds (two decimals), or "null" if no turn was answered within --limit seconds of --since.

With --session READY_FILE the tries are turns of one Converse session opened before the kill: the probe opens it,
has one turn answered, writes READY_FILE, and waits until --since-file holds the kill's unix time; then it tries a
turn in that session every 0.2 s (a turn that fails, or whose try runs out, leaves the session open). It prints the
seconds, the first turn's prompt tokens and the answered turn's: the history went on when the second is at least
the first plus the first turn's reply (its audio tokens), printed as the fourth field (or "null" and the reason).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "protos")]
from moss.speech.v1 import common_pb2  # noqa: E402

from services.gateway.client import converse, synthesize  # noqa: E402

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


async def wait_for_file(path: Path, limit: float) -> str:
    end = time.time() + limit
    while time.time() < end:
        if path.exists() and (text := path.read_text().strip()):
            return text
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{path} not written within {limit:.0f} s")


async def session_answer(target: str, ready: Path, since_file: Path, limit: float, try_seconds: float) -> str:
    """A session's first turn, then (once since_file holds the kill's time) its next turns until one is answered
    → "seconds first_prompt_tokens answered_prompt_tokens history_went_on", or "null REASON"."""
    sampling = common_pb2.SamplingParams(max_new_tokens=8, min_new_tokens=8)
    async with converse(target, timeout=limit + 120) as conv:
        first = await conv.say("before the restart", sampling=sampling)
        if first.summary is None:
            return f"null the first turn was not answered: {first.failed or first.cancelled}"
        ready.write_text(f"{first.summary.prompt_tokens}\n")
        since = float(await wait_for_file(since_file, limit))
        while time.time() - since < limit:
            # A try that runs out is cancelled by a CancelTurn, not by cancelling the read: that would end the call
            turn = asyncio.ensure_future(conv.say("after the restart", sampling=sampling))
            done, _ = await asyncio.wait([turn], timeout=try_seconds)
            if not done:
                await conv.cancel()
            result = await turn
            if result.summary is not None:
                carried = result.summary.prompt_tokens >= first.summary.prompt_tokens + first.summary.audio_tokens
                return (f"{time.time() - since:.2f} {first.summary.prompt_tokens} {result.summary.prompt_tokens} "
                        f"{'yes' if carried else 'no'}")
            await asyncio.sleep(PAUSE)  # failed (UNAVAILABLE while a stage is down, or refused): the session goes on
        return "null no turn answered in time"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--since", type=float, help="unix time to count from (without --session)")
    p.add_argument("--session", type=Path, metavar="READY_FILE", help="tries in a session opened before the kill")
    p.add_argument("--since-file", type=Path, help="with --session: where the kill's unix time will be written")
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--limit", type=float, default=150.0)
    p.add_argument("--try-seconds", type=float, default=3.0)
    args = p.parse_args()
    if args.session:
        if not args.since_file:
            p.error("--session needs --since-file")
        import grpc

        try:
            print(asyncio.run(session_answer(args.target, args.session, args.since_file, args.limit, args.try_seconds)))
        except grpc.aio.AioRpcError as err:  # no gateway, or it ended the session: said on one line
            print(f"null the session did not open or ended: {err.code().name}: {err.details()}")
        except TimeoutError as err:
            print(f"null {err}")
        return 0
    if args.since is None:
        p.error("--since is required without --session")
    seconds = asyncio.run(first_answer(args.target, args.since, args.limit, args.try_seconds))
    print("null" if seconds is None else f"{seconds:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
