"""Running a gRPC service: aio server with the error interceptor, health checking, reflection,
Prometheus /metrics on its own HTTP port, and a graceful stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from services.common.auth import ApiKeyInterceptor
from services.common.interceptor import ErrorInterceptor
from services.common.tls import ServerTls

log = logging.getLogger(__name__)

GRACE_SECONDS = 5.0
# After its device is lost a service waits only this long for its running calls: they have been failed with the
# error already (UNAVAILABLE, naming the service) and need only send it; the rest wait on a client that no longer
# matters (an H200's vocoder spent the whole GRACE_SECONDS so after a fault, while up could start no GPU stage again).
FATAL_GRACE_SECONDS = 0.5
# SIGUSR2 drains a service instead (`moss-serve up`'s rolling restart, rolling_restart.py): its health says NOT_SERVING
# for DRAIN_NOTICE_SECONDS while it still takes calls, so that the gateway's health checks (every 0.5 s by default) send
# new turns to the other replicas; then it takes no new call and gives the running ones up to DRAIN_SECONDS to end (a
# turn runs as long as its reply: 20 s of audio is ~5 s of llm work, and a vocoder stream ends with its turn).
DRAIN_NOTICE_SECONDS = 1.5
DRAIN_SECONDS = 120.0
# The health check's name for "nothing left to prepare": SERVING once a service that serves while it still prepares
# (a vocoder capturing CUDA graphs) is done, so that a rolling restart drains the next replica only then. Others are
# warm as soon as they serve.
WARM_SERVICE = "warm"
WARM_POLL_SECONDS = 0.5


async def serve(
    *,
    name: str,
    full_service_name: str,
    host: str,
    port: int,
    add_servicer: Callable[[grpc.aio.Server], None],
    on_done: Callable[[str, str], None],
    on_stop: Callable[[], Awaitable[None] | None] = lambda: None,
    readiness: Callable[[Callable[[bool], Awaitable[None]]], Awaitable[None]] | None = None,
    api_keys: list[bytes] | None = None,
    max_message_bytes: int = 4 << 20,
    max_streams_per_connection: int | None = None,
    tls: ServerTls | None = None,
    fatal: asyncio.Future | None = None,
    write_timeout: float | None = None,
    on_stalled: Callable[[str], None] = lambda method: None,
    warm: Callable[[], bool] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then stop taking calls, give running ones GRACE_SECONDS, and clean up; or until
    SIGUSR2, then drain: NOT_SERVING first, running calls given DRAIN_SECONDS (above), exit 0.

    readiness: a task that reports whether the service can do its work, through the callback it is given
    (the gateway's: both backends healthy). The health status is NOT_SERVING until it says yes. Without it,
    the service is SERVING once it listens.
    api_keys: if any, the API's methods need one of them as `authorization: Bearer <key>` (auth.py).
    max_message_bytes: the largest request message taken (larger: RESOURCE_EXHAUSTED from gRPC itself).
    max_streams_per_connection: calls one client connection may have open at once (HTTP/2's
    SETTINGS_MAX_CONCURRENT_STREAMS; more wait on the client's side, but in a burst gRPC's client sends a few
    early, and they are refused UNAVAILABLE, never started); None: no limit (llm and vocoder,
    whose one client, the gateway, carries every turn on one connection).
    tls: serve TLS (mutual, with a client CA) instead of plaintext (tls.py).
    fatal: completes with an exception when the service can no longer work (its device lost: device.py):
    serving stops as on SIGTERM but with FATAL_GRACE_SECONDS for the running calls, then serve raises it.
    write_timeout: seconds a streaming call may wait for its client to take a message, then it ends CANCELLED and
    on_stalled(method) is told (interceptor.py); None: as long as it takes (llm, vocoder: their client is the
    gateway, which reads what it asked for).
    warm: whether the service has nothing left to prepare (polled; WARM_SERVICE's health says so); None: warm when
    serving."""
    # gRPC sets SO_REUSEPORT by default on Linux: a second copy of a service would then bind the same port
    # and silently take half of the new connections. Off, a port in use is an error at start.
    # ErrorInterceptor first: it sees (and counts) the UNAUTHENTICATED of a refused key too.
    interceptors = [ErrorInterceptor(on_done, write_timeout, on_stalled)] + ([ApiKeyInterceptor(api_keys)] if api_keys else [])
    options = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", max_message_bytes)]
    if max_streams_per_connection:
        options.append(("grpc.max_concurrent_streams", max_streams_per_connection))
    server = grpc.aio.server(interceptors=interceptors, options=options)
    add_servicer(server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        [full_service_name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    address = f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError:  # grpcio >= 1.5x raises where older versions returned 0
        bound = 0
    if bound == 0:
        raise OSError(f"{name}: cannot bind {address}: the port is in use or the address is not this host's")
    await server.start()

    async def set_serving(serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", full_service_name) + ((WARM_SERVICE,) if warm is None else ()):
            await health.set(service, status)

    async def watch_warmth() -> None:
        while not warm():
            await asyncio.sleep(WARM_POLL_SECONDS)
        await health.set(WARM_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    if warm is not None:
        await health.set(WARM_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    await set_serving(readiness is None)
    watcher = asyncio.create_task(readiness(set_serving)) if readiness else None
    warming = asyncio.create_task(watch_warmth()) if warm is not None else None
    log.info("%s serving on %s%s", name, address, "" if tls is None else " (mutual TLS)" if tls.client_ca else " (TLS)")

    stop, drain = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR2, lambda: (drain.set(), stop.set()))
    waits = [asyncio.ensure_future(stop.wait())] + ([fatal] if fatal is not None else [])
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    waits[0].cancel()
    log.info("%s stopping", name)
    for task in (watcher, warming):
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    await health.enter_graceful_shutdown()
    if drain.is_set():
        log.info("%s draining: NOT_SERVING for %.1f s, then no new calls and up to %.0f s for the running ones",
                 name, DRAIN_NOTICE_SECONDS, DRAIN_SECONDS)
        await asyncio.sleep(DRAIN_NOTICE_SECONDS)
        await server.stop(DRAIN_SECONDS)
    else:
        await server.stop(FATAL_GRACE_SECONDS if fatal is not None and fatal.done() else GRACE_SECONDS)
    result = on_stop()
    if asyncio.iscoroutine(result):
        await result
    log.info("%s stopped", name)
    if fatal is not None and fatal.done():
        raise fatal.exception()


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
