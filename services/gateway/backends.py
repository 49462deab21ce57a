"""The gateway's two backends, llm and vocoder: their channels, and whether each answers its health check.

The gateway reports SERVING only while both backends do: a watcher asks each one's grpc.health.v1 Check
every POLL_SECONDS. A turn that finds a backend not ready waits for it, for at most `ready_wait` seconds and
within the turn's own deadline, instead of failing at once: requests sent while a stack is still starting
(or while a supervisor restarts a stage) are answered late, not refused. A backend that stays down fails the
turn with UNAVAILABLE naming it; one that dies during a turn fails that turn at once (pipeline.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from moss.speech.v1 import llm_pb2_grpc, vocoder_pb2_grpc

from services.common.errors import Unavailable
from services.common.tls import ChannelTls, channel
from services.gateway import metrics

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
CHECK_TIMEOUT = 1.0
# A stage that restarts is found again within a second: the default backoff grows to two minutes,
# and a channel in backoff fails calls at once without trying to connect.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Backend:
    def __init__(self, name: str, target: str, stub_class, tls: ChannelTls | None = None):
        self.name, self.target = name, target
        self.channel = channel(target, tls, CHANNEL_OPTIONS)
        self.stub = stub_class(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.ready = asyncio.Event()

    async def check(self) -> bool:
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(), timeout=CHECK_TIMEOUT)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


class Backends:
    def __init__(self, llm_target: str, vocoder_target: str, ready_wait: float, tls: ChannelTls | None = None):
        self.llm = Backend("llm", llm_target, llm_pb2_grpc.LlmStub, tls)
        self.vocoder = Backend("vocoder", vocoder_target, vocoder_pb2_grpc.VocoderStub, tls)
        self.ready_wait = ready_wait

    @property
    def all(self) -> tuple[Backend, Backend]:
        return self.llm, self.vocoder

    async def watch(self, on_change: Callable[[bool], Awaitable[None]]) -> None:
        """Poll both health checks until cancelled; on_change(all ready) whenever that flips."""
        serving = None
        while True:
            for backend, ok in zip(self.all, await asyncio.gather(*(b.check() for b in self.all))):
                if ok != backend.ready.is_set():
                    log.info("gateway: %s at %s is %s", backend.name, backend.target, "ready" if ok else "NOT ready")
                    (backend.ready.set if ok else backend.ready.clear)()
                metrics.BACKEND_READY.labels(backend.name).set(int(ok))
            now_serving = all(b.ready.is_set() for b in self.all)
            if now_serving != serving:
                serving = now_serving
                await on_change(serving)
            await asyncio.sleep(POLL_SECONDS)

    async def wait_ready(self, budget: float) -> float:
        """Wait until both backends are ready, for at most `ready_wait` and `budget` seconds
        → seconds waited. Raises Unavailable naming the first backend that was not."""
        if all(b.ready.is_set() for b in self.all):
            return 0.0
        start = time.perf_counter()
        try:
            await self._wait(start, budget)
        finally:
            metrics.READY_WAIT.observe(time.perf_counter() - start)
        return time.perf_counter() - start

    async def _wait(self, start: float, budget: float) -> None:
        for backend in self.all:
            if backend.ready.is_set():
                continue
            left = min(self.ready_wait, budget) - (time.perf_counter() - start)
            try:
                await asyncio.wait_for(backend.ready.wait(), max(left, 0.0))
            except TimeoutError:
                raise Unavailable(backend.name, f"not ready (no SERVING health check from {backend.target} "
                                                f"within {max(min(self.ready_wait, budget), 0.0):.1f} s)") from None

    def mark_down(self, name: str) -> None:
        """A turn found this backend unreachable: treat it as not ready until its health check passes again."""
        for backend in self.all:
            if backend.name == name and backend.ready.is_set():
                log.info("gateway: %s at %s failed a turn; NOT ready until its health check passes", name, backend.target)
                backend.ready.clear()

    async def close(self) -> None:
        for backend in self.all:
            await backend.channel.close()
