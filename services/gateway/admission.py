"""Admission control: at most `max_turns` turns run at once, at most `max_queued` more wait for a place
(first come, first served, each within its own deadline), and any beyond that are refused at once with
RESOURCE_EXHAUSTED and a retry hint, never left hanging.

The hint is how long the queue ahead would take to drain at the recent pace: the mean duration of the last
turns, times the turns ahead of a newcomer per running place; at least RETRY_MIN and at most RETRY_MAX.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

from services.common.errors import DeadlineExceeded, ResourceExhausted
from services.gateway import metrics

RETRY_MIN, RETRY_MAX = 0.1, 30.0
RECENT_TURNS = 32


class Admission:
    def __init__(self, max_turns: int, max_queued: int):
        self.max_turns, self.max_queued = max_turns, max_queued
        self.running = 0
        self.waiting: collections.deque[asyncio.Future] = collections.deque()
        self.recent = collections.deque(maxlen=RECENT_TURNS)  # seconds each recent turn held its place

    def retry_after(self) -> float:
        mean = sum(self.recent) / len(self.recent) if self.recent else 1.0
        return min(max(mean * (len(self.waiting) + 1) / self.max_turns, RETRY_MIN), RETRY_MAX)

    @contextlib.asynccontextmanager
    async def turn(self, deadline: float | None):
        """Hold a running place for the body; wait for one (until `deadline` seconds from now) if needed."""
        if self.running >= self.max_turns or self.waiting:
            if len(self.waiting) >= self.max_queued:
                metrics.ADMISSIONS_REFUSED.inc()
                raise ResourceExhausted(f"gateway busy: {self.running} turns running and {len(self.waiting)} waiting "
                                        f"(--max-turns {self.max_turns}, --max-queued-turns {self.max_queued})",
                                        retry_after=self.retry_after())
            await self._wait(deadline)
        else:
            self.running += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self.recent.append(time.perf_counter() - start)
            self._release()

    async def _wait(self, deadline: float | None) -> None:
        place = asyncio.get_running_loop().create_future()
        self.waiting.append(place)
        metrics.QUEUED_TURNS.set(len(self.waiting))
        start = time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.shield(place), deadline)
        except BaseException as exc:  # the deadline passed, or the client left
            if place.done() and not place.cancelled():
                self._release()  # handed a place in that same instant: pass it on
            else:
                place.cancel()
                with contextlib.suppress(ValueError):
                    self.waiting.remove(place)
            if isinstance(exc, TimeoutError):
                raise DeadlineExceeded(f"deadline exceeded after {time.perf_counter() - start:.2f} s waiting for a "
                                       f"place ({self.running} turns running)") from None
            raise
        finally:
            metrics.QUEUED_TURNS.set(len(self.waiting))
            metrics.ADMISSION_WAIT.observe(time.perf_counter() - start)

    def _release(self) -> None:
        """A place frees: hand it to the first waiter still waiting, else give it back."""
        while self.waiting:
            place = self.waiting.popleft()
            if not place.done():
                place.set_result(None)  # `running` stays: the place passes on
                metrics.QUEUED_TURNS.set(len(self.waiting))
                return
        self.running -= 1
