"""Readiness: the gateway is NOT_SERVING until its backends answer their health checks, and a request that
arrives while a backend is still starting waits for it (within its deadline) instead of failing at once."""

import asyncio
import contextlib
import time

import grpc
from conftest import metric_value, scrape
from grpc_health.v1 import health_pb2, health_pb2_grpc
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.stack import NO_SPEECH, Ports, Stack

SAMPLING = common_pb2.SamplingParams(max_new_tokens=6, seed=1)


def health(target: str) -> int | None:
    """The server's overall health status, or None when nothing answers."""
    with grpc.insecure_channel(target) as channel:
        try:
            return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status
        except grpc.RpcError:
            return None


async def synthesize(target: str, timeout: float) -> list:
    async with grpc.aio.insecure_channel(target) as channel:
        request = gateway_pb2.SynthesizeRequest(text="hello", sampling=SAMPLING)
        return [m async for m in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=timeout)]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_gateway_waits_for_backends_that_are_starting(tmp_path):
    # --ready-wait 60: a request waits for the backends as long as a loaded 2-core machine may take to start them
    # (the default's 10 s was once too short in CI); the test is that it waits and then succeeds.
    stack = Stack(Ports.free(), without=NO_SPEECH, log_dir=tmp_path / "logs",
                  extra_args={"gateway": ["--ready-wait", "60"]})
    gateway = stack.target("gateway")
    try:
        stack.start("gateway")  # alone: neither backend is up yet
        wait_for(lambda: health(gateway) is not None, 60, "the gateway never answered")
        assert health(gateway) == health_pb2.HealthCheckResponse.NOT_SERVING
        metrics_port = stack.ports.metrics["gateway"]
        wait_for(lambda: 'gateway_backend_ready{backend="llm"}' in scrape(metrics_port), 5, "no backend gauge")
        assert metric_value(scrape(metrics_port), "gateway_backend_ready", '{backend="llm"}') == 0

        async def scenario():
            # sent while nothing is behind the gateway: it waits, then succeeds once the backends are up
            early = asyncio.create_task(synthesize(gateway, timeout=90))
            await asyncio.sleep(1.0)
            assert not early.done()
            await asyncio.to_thread(stack.start, "llm")
            await asyncio.to_thread(stack.start, "vocoder")
            return await early

        messages = asyncio.run(scenario())
        assert messages[-1].summary.num_samples > 0
        wait_for(lambda: health(gateway) == health_pb2.HealthCheckResponse.SERVING, 10, "the gateway never turned SERVING")
        text = scrape(metrics_port)
        assert metric_value(text, "gateway_backend_ready", '{backend="llm"}') == 1
        assert metric_value(text, "gateway_ready_wait_seconds_count") == 1  # the early turn waited...
        assert metric_value(text, "gateway_ready_wait_seconds_sum") > 1.0   # ...for longer than the 1 s before the start
    finally:
        stack.stop_all()


@contextlib.contextmanager
def gateway_alone(tmp_path, ready_wait: float):
    """A gateway with neither backend behind it, answering health checks → its target."""
    stack = Stack(Ports.free(), without=NO_SPEECH, log_dir=tmp_path / "logs",
                  extra_args={"gateway": ["--ready-wait", str(ready_wait)]})
    gateway = stack.target("gateway")
    try:
        stack.start("gateway")
        wait_for(lambda: health(gateway) is not None, 60, "the gateway never answered")
        yield gateway
    finally:
        stack.stop_all()


def refused(gateway: str, timeout: float) -> tuple[grpc.aio.AioRpcError, float]:
    """A Synthesize call that must fail → (its error, seconds until it did)."""
    start = time.monotonic()
    try:
        asyncio.run(synthesize(gateway, timeout=timeout))
    except grpc.aio.AioRpcError as err:
        return err, time.monotonic() - start
    raise AssertionError("a request went through with no backends")


def test_a_backend_that_stays_down_is_unavailable_after_the_ready_wait(tmp_path):
    with gateway_alone(tmp_path, ready_wait=0.5) as gateway:
        err, seconds = refused(gateway, timeout=30)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert "llm unavailable: not ready" in err.details(), err.details()
        assert seconds < 5
        # the deadline bounds the wait too: a 0.2 s deadline is not kept waiting for the 0.5 s ready-wait
        err, seconds = refused(gateway, timeout=0.2)
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert seconds < 0.45
        assert health(gateway) == health_pb2.HealthCheckResponse.NOT_SERVING


def test_a_wait_longer_than_the_deadline_is_answered_before_the_deadline(tmp_path):
    # --ready-wait 30 outlasts the call's 2 s deadline: the gateway answers UNAVAILABLE naming the stage not ready
    # (servicer.ANSWER_MARGIN_SECONDS before the deadline), not the caller's bare DEADLINE_EXCEEDED, and grpc logs no
    # ExecuteBatchError (a status sent on a call the deadline had already ended: each side's clock once ran out at the
    # same instant)
    with gateway_alone(tmp_path, ready_wait=30) as gateway:
        err, seconds = refused(gateway, timeout=2.0)
        assert err.code() == grpc.StatusCode.UNAVAILABLE, (err.code(), err.details())
        assert "llm unavailable: not ready" in err.details(), err.details()
        assert 1.5 < seconds < 2.0
    assert "ExecuteBatchError" not in (tmp_path / "logs" / "gateway.log").read_text()
