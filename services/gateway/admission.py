"""Admission control: at most `max_turns` turns run at once, at most `max_queued` more wait for a place
(first come, first served, each within its own deadline), and any beyond that are refused at once with
RESOURCE_EXHAUSTED and a retry hint, never left hanging. One client (an API key, or an address: `client_of`) may
have at most `max_per_client` turns running or waiting, so that it cannot take every place. A client without a key
on a loopback address (a proxy on the host, the bench) is no one client: it is not counted.

A turn held because its client stopped reading (pipeline.Turn._client_reading) keeps its place: its vocoder stream
and its KV blocks stay its own, it may go on at any moment and then needs them at once, and --client-stall-seconds
ends it soon (10 s by default). At the llm it takes no running place (services/llm/engine/scheduler.py), and under
admission by headroom it does not count against the limit, which is what the stages play in time: held, it plays
nothing (`Place.held`). So clients that stop reading do not take a CPU stack's few turns from the ones that read; if
they read again, the slack their streams leave says whether the stages still keep up.

Ongoing sessions first: a turn of a Converse session that has been answered before (`ongoing`) waits ahead of every
new one (a Synthesize call, a session's first turn), and under admission by headroom it may run up to `ONGOING_RESERVE`
over the limit: past the knee, new sessions are refused before a conversation is cut off mid-way.

Refusals first in a burst (`start_quiet`): an admitted turn may wait, before it starts, until no call has come in for
`start_quiet` seconds (at most START_QUIET_MAX). On a 2-core CPU a burst's refusals share the cores with the start of
the turns it admits (the gateway's calls to the stages, the llm's prefill): with start_quiet 5 ms the refusals of
bursts of 96 came at p95 29-36 ms in 9 of 9, against 38-89 ms without (docs/benchmarks.md, refusals-cpu-2026-11-30).

The hint is how long the queue ahead would take to drain at the recent pace: the mean duration of the last
turns, times the turns ahead of a newcomer per running place (a client at its own limit: its own turns, one place
each); at least RETRY_MIN and at most RETRY_MAX.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import ipaddress
import logging
import math
import time

from services.common.auth import api_key
from services.common.errors import DeadlineExceeded, ResourceExhausted
from services.gateway import metrics
from services.gateway.headroom import Headroom

RETRY_MIN, RETRY_MAX = 0.1, 30.0
RECENT_TURNS = 32
ONGOING_RESERVE = 0.1  # share of the headroom limit that only turns of ongoing sessions may take
LOG_EVERY = 5.0  # seconds between log lines of the headroom limit falling
START_QUIET_MAX = 0.03  # seconds at most that an admitted turn waits for a quiet moment (`start_quiet`)

log = logging.getLogger(__name__)


def client_of(context) -> str | None:
    """Who a gRPC call is from, for --max-turns-per-client: client_id of its key and its peer."""
    return client_id(api_key(context.invocation_metadata()), context.peer() or "")


def client_id(key: str | None, peer: str) -> str | None:
    """A client's identity at any door: its API key (a digest: keys are not kept or logged), else its address without
    the port (gRPC's peer form, e.g. "ipv4:10.0.0.7:51234" → "ipv4:10.0.0.7"). None, not counted, for a client
    without a key on this host (a loopback address, a unix socket): a proxy or the bench, speaking for many."""
    if key is not None:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = address.rsplit(":", 1)[0]
        return None if is_loopback(host.strip("[]")) else f"{kind}:{host}"
    return None if kind == "unix" else peer


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


class Place:
    """A turn's hold on its admission, handed to the turn: `started()` once its first audio is out, which frees its
    start slot (--max-starting-turns) for the next turn to start. asked_at: when the turn asked for it (perf_counter),
    so that the turn's times count its wait for a place and a start slot (pipeline.Turn)."""

    def __init__(self, starting: asyncio.Semaphore | None, asked_at: float, admission: "Admission | None" = None):
        self.starting, self.asked_at, self.admission = starting, asked_at, admission

    def started(self) -> None:
        if self.starting is not None:
            self.starting.release()
            self.starting = None

    @contextlib.contextmanager
    def held(self):
        """While the turn is held (its client stopped reading): not counted against the headroom limit."""
        if self.admission is None:
            yield
            return
        self.admission.held += 1
        try:
            yield
        finally:
            self.admission.held -= 1


class Admission:
    def __init__(self, max_turns: int, max_queued: int, max_per_client: int = 0, headroom: Headroom | None = None,
                 max_starting: int = 0, start_quiet: float = 0.0, start_quiet_max: float = START_QUIET_MAX):
        """max_per_client: turns one client may have running or waiting (0: no limit of its own). headroom: also
        refuse, at once, a turn the stages have no room for (headroom.py); the turns feed it their signals.
        max_starting: turns admitted but without first audio yet (prefill, first chunks), at most; more wait, in
        order, within their deadlines (0: no limit). A burst then starts as a quick ramp: every stage's start-up work
        (the llm's prefills, the vocoder's first chunks) comes in batches it serves in time, not all at once.
        start_quiet: seconds without a new call that an admitted turn waits for before it starts, at most
        start_quiet_max (0: none), so that a burst's refusals are answered first (above)."""
        self.max_turns, self.max_queued, self.max_per_client = max_turns, max_queued, max_per_client
        self.given_max_turns = max_turns  # --max-turns; max_turns is less where the vocoders have fewer slots
        self.headroom = headroom
        self.starting = asyncio.Semaphore(max_starting) if max_starting else None
        self.start_quiet, self.start_quiet_max = start_quiet, start_quiet_max
        self.last_call = -math.inf  # when the latest turn asked (perf_counter), admitted or not
        metrics.HEADROOM_LIMIT.set(headroom.limit if headroom else max_turns)
        self.running = 0
        self.held = 0  # of the turns running, those held because their clients stopped reading (Place.held)
        self.waiting: collections.deque[asyncio.Future] = collections.deque()  # ongoing sessions' turns first
        self.ongoing_waiting: set[asyncio.Future] = set()
        self.recent = collections.deque(maxlen=RECENT_TURNS)  # seconds each recent turn held its place
        self.by_client: collections.Counter[str] = collections.Counter()  # turns running or waiting, per client
        self.logged = (-math.inf, headroom.limit if headroom else 0.0)  # (when, limit) of the last log line

    def cap_turns(self, slots: int | None) -> None:
        """The vocoders decode `slots` streams at full speed (None: no limit of theirs): no more turns than that run at
        once, whatever --max-turns says (a turn past them would decode slowly, and stall)."""
        before = self.max_turns
        self.max_turns = min(self.given_max_turns, slots) if slots else self.given_max_turns
        if self.headroom is not None:
            self.headroom.cap(self.max_turns)
            metrics.HEADROOM_LIMIT.set(self.headroom.limit)
        else:
            metrics.HEADROOM_LIMIT.set(self.max_turns)
        if self.max_turns != before:
            log.info("admission: at most %d turns running (%s)", self.max_turns,
                     f"the vocoders' {slots} stream slots, under --max-turns {self.given_max_turns}"
                     if self.max_turns < self.given_max_turns else f"--max-turns {self.given_max_turns}")
        while self.waiting and self.running < self.max_turns:  # room made: the first waiters run
            place = self.waiting.popleft()
            if not place.done():
                self.running += 1
                place.set_result(None)
        metrics.QUEUED_TURNS.set(len(self.waiting))

    def retry_after(self, ahead: float | None = None) -> float:
        """ahead: turns to finish before a place frees, per place (default: the queue's, over every place)."""
        mean = sum(self.recent) / len(self.recent) if self.recent else 1.0
        ahead = (len(self.waiting) + 1) / self.max_turns if ahead is None else ahead
        return min(max(mean * ahead, RETRY_MIN), RETRY_MAX)

    def turn(self, deadline: float | None, client: str | None = None, ongoing: bool = False):
        """`async with admission.turn(...) as place`: hold a running place for the body; wait for one (until
        `deadline` seconds from now) if needed. client: who asks (client_of), counted against max_per_client;
        ongoing: a turn of a session answered before. A turn that cannot be taken is refused (ResourceExhausted)
        by this call itself, before any context manager is made: in a burst of refusals each one's own work
        delays the last."""
        self.last_call = time.perf_counter()
        counted = client is not None and bool(self.max_per_client)
        if counted and self.by_client[client] >= self.max_per_client:
            metrics.ADMISSIONS_REFUSED_CLIENT.inc()
            raise ResourceExhausted(f"this client has {self.by_client[client]} turns running or waiting "
                                    f"(--max-turns-per-client {self.max_per_client})",
                                    retry_after=self.retry_after(ahead=1 / self.by_client[client]))
        self._refuse_if_full(ongoing)
        # (nothing can run between these checks and the place taken: entering _turn does not suspend before it)
        return self._turn(deadline, client if counted else None, ongoing)

    def _refuse_if_full(self, ongoing: bool) -> None:
        """ResourceExhausted when the stages have no headroom for another turn, or every place and queue slot is
        taken."""
        if self.headroom is not None:
            now = time.perf_counter()
            admitted = self.headroom.admits(now, self.playing, reserve=ONGOING_RESERVE if ongoing else 0.0,
                                            ongoing=ongoing)
            metrics.HEADROOM_LIMIT.set(self.headroom.limit)
            self._log_limit(now)
            if self.headroom.over_limit:
                metrics.BURST_ADMITTED.inc()
            if not admitted:
                metrics.HEADROOM_REFUSED.inc()
                raise ResourceExhausted(f"no headroom: {self.playing} turns playing, as many as the stages serve in "
                                        f"time now ({self.headroom.last_reason}; --admission headroom)",
                                        retry_after=self.retry_after(ahead=self._ahead_of_headroom()))
        if (self.running >= self.max_turns or self.waiting) and len(self.waiting) >= self.max_queued:
            metrics.ADMISSIONS_REFUSED.inc()
            raise ResourceExhausted(f"gateway busy: {self.running} turns running and {len(self.waiting)} waiting "
                                    f"(--max-turns {self.max_turns}, --max-queued-turns {self.max_queued})",
                                    retry_after=self.retry_after())

    @property
    def playing(self) -> int:
        """Turns running and not held: what the headroom limit counts."""
        return self.running - self.held

    def _ahead_of_headroom(self) -> float:
        """Turns to end, per turn playing, before the headroom limit lets one more in: one at the limit; more where
        the turns playing are over it (a burst let in, a limit that has fallen)."""
        over = self.playing - int(self.headroom.limit) + 1
        return max(1, over) / max(self.playing, 1)

    @contextlib.asynccontextmanager
    async def _turn(self, deadline: float | None, client: str | None, ongoing: bool):
        """A place for the body; client (None: not counted) holds one of its own places while it waits and runs."""
        if client is not None:
            self.by_client[client] += 1
        try:
            async with self._place(deadline, ongoing) as place:
                yield place
        finally:
            if client is not None:
                self.by_client[client] -= 1
                if not self.by_client[client]:
                    del self.by_client[client]

    @contextlib.asynccontextmanager
    async def _place(self, deadline: float | None, ongoing: bool = False):
        asked = time.perf_counter()  # (the turn asked just now: nothing suspends between turn() and here)
        if self.running >= self.max_turns or self.waiting:  # (a queue slot is free: _refuse_if_full said so)
            await self._wait(deadline, ongoing)
        else:
            self.running += 1
        start = time.perf_counter()
        try:
            if self.start_quiet:
                await self._quiet()
            place = Place(await self._start_slot(deadline), asked, self)
            try:
                yield place
            finally:
                place.started()  # (a turn that failed or ended before its first audio)
        finally:
            self.recent.append(time.perf_counter() - start)
            self._release()

    async def _quiet(self) -> None:
        """Wait until no turn has asked for `start_quiet` seconds, or `start_quiet_max` have gone by."""
        until = time.perf_counter() + self.start_quiet_max
        while (wait := min(self.last_call + self.start_quiet, until) - time.perf_counter()) > 0:
            await asyncio.sleep(wait)

    async def _start_slot(self, deadline: float | None) -> asyncio.Semaphore | None:
        """Wait for a start slot (--max-starting-turns) → the semaphore to release once started, or None."""
        if self.starting is None:
            return None
        start = time.perf_counter()
        try:
            await asyncio.wait_for(self.starting.acquire(), deadline)
        except TimeoutError:
            raise DeadlineExceeded(f"deadline exceeded after {time.perf_counter() - start:.2f} s waiting to start "
                                   f"(--max-starting-turns: as many turns are starting)") from None
        finally:
            metrics.START_WAIT.observe(time.perf_counter() - start)
        return self.starting

    def _log_limit(self, now: float) -> None:
        """The headroom limit, once it has fallen since the last line (at most every LOG_EVERY seconds)."""
        when, limit = self.logged
        if self.headroom.limit < limit and now - when >= LOG_EVERY:
            log.info("admission limit %d -> %d turns (the latest fall: %s)", limit, self.headroom.limit,
                     self.headroom.fall_reason)
            self.logged = (now, self.headroom.limit)
        elif self.headroom.limit > limit:  # risen: a fall from here is news
            self.logged = (when, self.headroom.limit)

    async def _wait(self, deadline: float | None, ongoing: bool) -> None:
        place = asyncio.get_running_loop().create_future()
        if ongoing:  # behind the ongoing sessions' turns already waiting, ahead of every new one
            self.waiting.insert(sum(1 for w in self.waiting if w in self.ongoing_waiting), place)
            self.ongoing_waiting.add(place)
        else:
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
            self.ongoing_waiting.discard(place)
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
