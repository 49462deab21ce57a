"""Transport limits at the gateway: a request message over --max-message-bytes is refused RESOURCE_EXHAUSTED
(and the gateway goes on serving); a client connection has at most --max-streams-per-connection calls open,
and its further calls wait for one to end (calls on another connection do not)."""

import asyncio
import time

import grpc
import pytest
from conftest import gateway_stack
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

LONG = common_pb2.SamplingParams(max_new_tokens=150, min_new_tokens=150, seed=1)  # ~1 s or more on CPU


@pytest.fixture(scope="module")
def limited(stack, tmp_path_factory):
    with gateway_stack(stack, tmp_path_factory.mktemp("logs"), "--max-message-bytes", "3000",
                       "--max-streams-per-connection", "2") as limited:
        yield limited.target("gateway")


async def timed_call(stub) -> tuple[float, float]:
    """→ (when its first message came, when it ended), perf_counter seconds."""
    call = stub.Synthesize(gateway_pb2.SynthesizeRequest(text="a longer reply", sampling=LONG), timeout=60)
    await call.read()
    first = time.perf_counter()
    while await call.read() is not grpc.aio.EOF:
        pass
    return first, time.perf_counter()


def test_a_message_over_the_limit_is_resource_exhausted(limited):
    async def run(text):
        async with grpc.aio.insecure_channel(limited) as channel:
            request = gateway_pb2.SynthesizeRequest(text=text, sampling=common_pb2.SamplingParams(max_new_tokens=2, seed=1))
            return [m async for m in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=30)]

    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(run("x" * 5000))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert asyncio.run(run("hi"))[-1].summary.audio_tokens == 2  # still serving


def test_a_connection_has_at_most_its_streams_open(limited):
    async def run(connections: int):
        # (each its own subchannel pool: channels to one target otherwise share one connection)
        channels = [grpc.aio.insecure_channel(limited, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(connections)]
        try:
            stubs = [gateway_pb2_grpc.GatewayStub(c) for c in channels]
            for c in channels:
                await c.channel_ready()
            return await asyncio.gather(*(timed_call(stubs[i % connections]) for i in range(3)))
        finally:
            for c in channels:
                await c.close()

    def started_late(times) -> bool:
        """Did some call's first message come only after another call had ended?"""
        return max(first for first, _ in times) >= min(end for _, end in times)

    assert started_late(asyncio.run(run(1)))       # one connection: the third call waited for a place
    assert not started_late(asyncio.run(run(3)))   # three connections: all three ran at once
