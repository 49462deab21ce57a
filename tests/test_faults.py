"""A stage killed in the middle of a stream (SIGKILL: no goodbye), under Synthesize and under a Converse turn: the
client gets UNAVAILABLE naming it within 2 s, the surviving stage is left with nothing allocated, and once the
stage is started again new requests succeed through the same gateway."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from conftest import metric_value, scrape
from services.stack import Ports, Stack

LONG = common_pb2.SamplingParams(max_new_tokens=400, min_new_tokens=400, seed=1)  # many seconds on CPU


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with Stack(Ports.free(), log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


def idle(stack, service: str) -> dict[str, float]:
    text = scrape(stack.ports.metrics[service])
    if service == "llm":
        return {k: metric_value(text, k) for k in ("llm_requests_running", "llm_requests_waiting", "llm_kv_blocks_used")}
    return {"vocoder_active_streams": metric_value(text, "vocoder_active_streams")}


def open_call(channel, rpc: str):
    """A call whose reply is long, under way: Synthesize, or a turn of a Converse session."""
    stub = gateway_pb2_grpc.GatewayStub(channel)
    if rpc == "synthesize":
        return stub.Synthesize(gateway_pb2.SynthesizeRequest(text="a long reply", sampling=LONG), timeout=120)
    return stub.Converse(iter([gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(sampling=LONG)),
                               gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(text="a long reply"))]), timeout=120)


@pytest.mark.parametrize("rpc", ["synthesize", "converse"])
@pytest.mark.parametrize("victim, survivor", [("vocoder", "llm"), ("llm", "vocoder")])
def test_a_stage_killed_mid_stream(stack, victim, survivor, rpc):
    target = stack.target("gateway")

    async def scenario():
        async with grpc.aio.insecure_channel(target) as channel:
            call = open_call(channel, rpc)
            while (msg := await call.read()).WhichOneof("kind") != "audio":
                pass  # audio is flowing: the stream is in the middle
            os.kill(stack.procs[victim].pid, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while await call.read() is not grpc.aio.EOF:
                    pass
            return info.value, time.monotonic() - killed

    err, seconds = asyncio.run(scenario())
    assert err.code() == grpc.StatusCode.UNAVAILABLE and err.details().startswith(f"{victim} unavailable"), err.details()
    assert seconds < 2.0, seconds
    deadline = time.monotonic() + 10
    while any(idle(stack, survivor).values()):  # the survivor lets go of the stream
        assert time.monotonic() < deadline, f"{survivor} still holds: {idle(stack, survivor)}"
        time.sleep(0.2)
    gateway = scrape(stack.ports.metrics["gateway"])
    assert metric_value(gateway, "gateway_active_requests") == metric_value(gateway, "gateway_active_sessions") == 0

    stack.procs.pop(victim).wait()
    stack.start(victim)  # back: new requests go through the same gateway
    stack.wait_serving([victim])

    async def again():
        async with grpc.aio.insecure_channel(target) as channel:
            request = gateway_pb2.SynthesizeRequest(text="hello again", sampling=common_pb2.SamplingParams(max_new_tokens=6))
            return [m async for m in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=30)]

    assert asyncio.run(again())[-1].summary.audio_tokens == 6  # the gateway waits for it to be ready
