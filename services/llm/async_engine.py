"""Drives the synchronous engine from one background thread and streams its chunks to asyncio.

The engine is not thread-safe: every call into it (add, abort, step) happens on the engine thread.
Callers hand requests and aborts over through a queue; chunks come back to per-request asyncio queues
through `loop.call_soon_threadsafe`. When the engine paces speech (`hold_seconds`), the thread waits on
that queue instead of stepping, so a new request ends the wait at once.

A step slower than SLOW_SECONDS, or as long spent between two steps (the thread's own work, or waiting
for the interpreter lock), is logged with what the step held: the first place to look when streams stall.

A step that fails fails the requests it held; if the device itself is lost (`lost()`: a sticky CUDA error,
services/common/device.py; also asked every PROBE_SECONDS while idle), every request, held or still coming,
fails with DeviceLost, the thread ends, and `on_fatal` tells the server to stop, so that the service is
started again on a fresh context.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable

from services.common.device import PROBE_SECONDS
from services.common.errors import DeviceLost, Internal, ServiceError
from services.llm.engine.engine import LLMEngine
from services.llm.engine.stats import EngineLoad, StepStats
from services.llm.sequence import Chunk, Sequence

log = logging.getLogger(__name__)

_ABORT = object()
_CALL = object()  # (_CALL, fn, loop, future): fn() on the engine thread, its result into the caller's future
SLOW_SECONDS = 0.1


class AsyncEngine:
    def __init__(
        self,
        engine: LLMEngine,
        on_step: Callable[[StepStats], None] = lambda s: None,
        on_load: Callable[[EngineLoad], None] = lambda load: None,
        on_hold: Callable[[float], None] = lambda seconds: None,
        lost: Callable[[], bool] = lambda: False,
        on_fatal: Callable[[DeviceLost], None] = lambda err: None,
        probe_seconds: float = PROBE_SECONDS,
    ):
        """on_step per step; on_load whenever the queues may have changed; on_hold(seconds) after each
        wait that pacing imposed; lost(): is the device gone? (asked after a failed step, and after every
        probe_seconds idle); on_fatal(err) once if so (from the engine thread)."""
        self.engine = engine
        self.on_step = on_step
        self.on_load = on_load
        self.on_hold = on_hold
        self.lost, self.on_fatal, self.probe_seconds = lost, on_fatal, probe_seconds
        self.fatal: DeviceLost | None = None  # set when the device was lost: the thread has ended
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outputs: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}  # by seq_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout=10)

    async def generate(self, seq: Sequence) -> AsyncIterator[Chunk]:
        """Submit `seq` and yield its chunks; leaving early (cancel, error) aborts it in the engine."""
        loop = asyncio.get_running_loop()
        out: asyncio.Queue = asyncio.Queue()
        self._outputs[seq.seq_id] = (loop, out)  # before the check: the thread, dying, fails every registered one
        done = False
        try:
            if self.fatal is not None:
                raise self.fatal
            self._inbox.put(seq)
            while True:
                item = await out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.final:
                    done = True
                    return
        finally:
            self._outputs.pop(seq.seq_id, None)
            if not done:
                self._inbox.put((_ABORT, seq.seq_id))

    async def release_session(self, session_id: str) -> bool:
        """Let a session's pinned blocks go, on the engine thread (after any abort sent before it)."""
        return await self._on_engine_thread(lambda: self.engine.release_session(session_id))

    async def hold(self, request_id: str, held: bool) -> bool:
        """Hold a request, or release it (LLMEngine.hold), on the engine thread → whether it was found."""
        return await self._on_engine_thread(lambda: self.engine.hold(request_id, held))

    async def _on_engine_thread(self, fn: Callable[[], bool]) -> bool:
        """fn() on the engine thread, in order with what was sent before → its result (False once the device is
        lost: what it would act on went with it)."""
        if self.fatal is not None:
            return False
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        self._inbox.put((_CALL, fn, loop, done))
        return await done

    # ---- engine thread ---------------------------------------------------------------------------
    def _deliver(self, seq_id: int, item) -> None:
        target = self._outputs.get(seq_id)
        if target is not None:
            loop, out = target
            loop.call_soon_threadsafe(out.put_nowait, item)

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Take what callers sent (requests, aborts, calls) → whether anything came."""
        came = False
        try:
            item = self._inbox.get(block=block, timeout=timeout)
            came = True
            while True:
                if isinstance(item, tuple) and item[0] is _ABORT:
                    self.engine.abort(item[1])
                elif isinstance(item, tuple) and item[0] is _CALL:
                    _, fn, loop, done = item
                    result = fn()
                    self.on_load(self.engine.load())  # (a caller that has the answer finds it in the metrics)
                    _answer(loop, done, result)
                elif item is not None:
                    self._add(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        return came

    def _add(self, seq: Sequence) -> None:
        try:
            self.engine.add(seq)
        except ServiceError as err:  # refused, nothing kept
            self._deliver(seq.seq_id, err)

    def _run(self) -> None:
        last_step_end = None  # while there is work: when the previous step returned
        while not self._stop.is_set():
            if not self.engine.has_work():
                last_step_end = None
                if not self._drain_inbox(block=True, timeout=self.probe_seconds) and self.lost():
                    self._die(DeviceLost("its GPU failed (found while idle); restarting"))  # (a fault elsewhere: MPS)
                    return
            elif (hold := self.engine.hold_seconds()) > 0:
                waited = time.perf_counter()
                self._drain_inbox(block=True, timeout=hold)  # a request or an abort ends the wait early
                self.on_hold(time.perf_counter() - waited)
                last_step_end = None
                self.on_load(self.engine.load())
                continue  # judge the hold again
            else:
                self._drain_inbox(block=False)
            self.on_load(self.engine.load())  # admissions and aborts change it between steps
            if self._stop.is_set() or not self.engine.has_work():
                continue
            start = time.perf_counter()
            try:
                chunks = self.engine.step()
            except Exception as exc:  # a failed step must not kill the loop or leak blocks
                log.exception("engine step failed")
                if self.lost():
                    self._die(DeviceLost(f"its GPU failed ({str(exc).splitlines()[0]}); restarting"))
                    return
                self._fail_all(exc)
                continue
            # The step's metrics first: a client that has its turn's last chunk finds its session pinned in them.
            self.on_step(self.engine.last_step)
            self.on_load(self.engine.load())
            for chunk in chunks:
                self._deliver(chunk.seq_id, chunk if chunk.error is None else Internal(chunk.error))
            self._log_if_slow(last_step_end, start, time.perf_counter())
            last_step_end = time.perf_counter()

    def _log_if_slow(self, previous_end: float | None, start: float, end: float) -> None:
        between = start - previous_end if previous_end is not None else 0.0
        if end - start < SLOW_SECONDS and between < SLOW_SECONDS:
            return
        s, load = self.engine.last_step, self.engine.load()
        log.warning("llm: slow step: %.0f ms in step() (batch %d: %d prefill and %d decode positions), %.0f ms "
                    "since the previous step; %d running, %d waiting", (end - start) * 1e3, s.batch_size,
                    s.prefill_tokens, s.decode_tokens, between * 1e3, load.running, load.waiting)

    def _die(self, err: DeviceLost) -> None:
        """The device is lost: fail every request (running, queued, registered), answer every call (False), and
        tell the server. The thread ends after this."""
        log.critical("llm: %s: failing every request and stopping", err)
        self.fatal = err
        # The server first: a client that sees the error finds it already going down (and a test that awaits the
        # error finds it told).
        self.on_fatal(err)
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, tuple) and item[0] is _CALL:
                _, _, loop, done = item
                _answer(loop, done, False)
        for seq_id in list(self._outputs):
            self._deliver(seq_id, err)

    def _fail_all(self, exc: Exception) -> None:
        err = exc if isinstance(exc, ServiceError) else Internal(f"engine step failed: {exc}")
        for seq_id in list(self.engine.sequences):
            self.engine.abort(seq_id)
            self._deliver(seq_id, err)


def _answer(loop: asyncio.AbstractEventLoop, done: asyncio.Future, result: bool) -> None:
    """Set a caller's future from the engine thread (unless the caller gave up on it)."""
    loop.call_soon_threadsafe(lambda: done.done() or done.set_result(result))
