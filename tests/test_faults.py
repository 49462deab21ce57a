"""A stage killed in the middle of a stream (SIGKILL: no goodbye), under Synthesize and under a Converse turn: the
client gets UNAVAILABLE naming it within 2 s (Synthesize: the call's status; Converse: the turn's TurnFailed, and
the session goes on), the surviving stage is left with nothing allocated, and once the stage is started again
new requests succeed through the same gateway, and the session's next turn too."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest
from conftest import metric_value, scrape
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.stack import NO_SPEECH, Ports, Stack

LONG = common_pb2.SamplingParams(max_new_tokens=400, min_new_tokens=400, seed=1)  # many seconds on CPU


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with Stack(Ports.free(http=True), without=NO_SPEECH, log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


def idle(stack, service: str) -> dict[str, float]:
    text = scrape(stack.ports.metrics[service])
    if service == "llm":
        return {k: metric_value(text, k) for k in ("llm_requests_running", "llm_requests_waiting", "llm_kv_blocks_used")}
    return {"vocoder_active_streams": metric_value(text, "vocoder_active_streams")}


async def open_call(channel, rpc: str):
    """A call whose reply is long, under way: Synthesize, or a turn of a Converse session (which stays open
    for more turns)."""
    stub = gateway_pb2_grpc.GatewayStub(channel)
    if rpc == "synthesize":
        return stub.Synthesize(gateway_pb2.SynthesizeRequest(text="a long reply", sampling=LONG), timeout=120)
    call = stub.Converse(timeout=120)
    await call.write(gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(sampling=LONG)))
    await call.write(gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(text="a long reply")))
    return call


@pytest.mark.parametrize("rpc", ["synthesize", "converse"])
@pytest.mark.parametrize("victim, survivor", [("vocoder", "llm"), ("llm", "vocoder")])
def test_a_stage_killed_mid_stream(stack, victim, survivor, rpc):
    """Synthesize ends with UNAVAILABLE naming the stage; a Converse turn gets a TurnFailed saying the same, and
    its session goes on: once the stage is back, its next turn is spoken."""
    target = stack.target("gateway")

    async def scenario():
        channel = grpc.aio.insecure_channel(target)
        call = await open_call(channel, rpc)
        while (msg := await call.read()).WhichOneof("kind") != "audio":
            pass  # audio is flowing: the stream is in the middle
        os.kill(stack.procs[victim].pid, signal.SIGKILL)
        killed = time.monotonic()
        if rpc == "synthesize":
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while await call.read() is not grpc.aio.EOF:
                    pass
            await channel.close()
            return info.value.code().name, info.value.details(), time.monotonic() - killed, None
        while (msg := await call.read()).WhichOneof("kind") != "failed":
            assert msg.WhichOneof("kind") in ("audio", "text"), msg
        return msg.failed.code, msg.failed.message, time.monotonic() - killed, (channel, call)

    code, message, seconds, session = run(scenario())
    assert code == "UNAVAILABLE" and message.startswith(f"{victim} unavailable"), message
    assert seconds < 2.0, seconds
    deadline = time.monotonic() + 10
    while any(idle(stack, survivor).values()):  # the survivor lets go of the stream
        assert time.monotonic() < deadline, f"{survivor} still holds: {idle(stack, survivor)}"
        time.sleep(0.2)
    gateway = scrape(stack.ports.metrics["gateway"])
    assert metric_value(gateway, "gateway_active_requests") == 0
    assert metric_value(gateway, "gateway_active_sessions") == (rpc == "converse")  # the session goes on

    stack.procs.pop(victim).wait()
    stack.start(victim)  # back: new requests go through the same gateway, and the session's next turn too
    stack.wait_serving([victim])

    async def again():
        if session is not None:
            channel, call = session
            await call.write(gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(
                text="hello again", sampling=common_pb2.SamplingParams(max_new_tokens=6, seed=1))))
            while (msg := await call.read()).WhichOneof("kind") != "summary":
                assert msg.WhichOneof("kind") in ("metadata", "audio", "text"), msg
            assert msg.turn == 2
            await call.write(gateway_pb2.ConverseRequest(close=gateway_pb2.CloseSession()))
            assert (await call.read()).WhichOneof("kind") == "ended"
            await channel.close()
        async with grpc.aio.insecure_channel(target) as channel:
            request = gateway_pb2.SynthesizeRequest(text="hello again", sampling=common_pb2.SamplingParams(max_new_tokens=6, seed=1))
            return [m async for m in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=30)]

    assert run(again())[-1].summary.audio_tokens == 6  # the gateway waits for it to be ready
    assert metric_value(scrape(stack.ports.metrics["gateway"]), "gateway_turn_failures_total",
                        '{code="UNAVAILABLE"}') >= (rpc == "converse")


def test_a_stage_killed_mid_http_speech(stack):
    """The HTTP door, once its audio has begun: the status is sent already, so an `audio` stream ends cut short (no
    last chunk: the client reports an incomplete body) and an `sse` one with an error event naming the stage. Both
    at once, under one kill."""
    import contextlib
    import json

    import httpx2 as httpx

    def speech(stream_format: str):
        body = {"model": "moss-speech", "voice": "alloy", "input": "a long reply", "response_format": "pcm",
                "stream_format": stream_format, "sampling": {"max_new_tokens": 400, "min_new_tokens": 400, "seed": 1}}
        return httpx.stream("POST", f"http://127.0.0.1:{stack.ports.http}/v1/audio/speech", json=body, timeout=30)

    with contextlib.ExitStack() as streams:
        audio, sse = streams.enter_context(speech("audio")), streams.enter_context(speech("sse"))
        assert audio.status_code == sse.status_code == 200
        audio_chunks, sse_lines = audio.iter_bytes(), sse.iter_lines()
        next(audio_chunks), next(sse_lines)  # audio is flowing in both
        os.kill(stack.procs["vocoder"].pid, signal.SIGKILL)
        with pytest.raises(httpx.RemoteProtocolError):
            for _ in audio_chunks:
                pass
        events = [json.loads(line[6:]) for line in sse_lines if line.startswith("data: ")]
        assert events[-1]["type"] == "error", events[-1]
        assert events[-1]["error"]["code"] == "service_unavailable"
        assert events[-1]["error"]["message"].startswith("vocoder unavailable")
    deadline = time.monotonic() + 10
    while any(idle(stack, "llm").values()):
        assert time.monotonic() < deadline, f"llm still holds: {idle(stack, 'llm')}"
        time.sleep(0.2)
    stack.procs.pop("vocoder").wait()
    stack.start("vocoder")
    stack.wait_serving(["vocoder"])


_LOOP = asyncio.new_event_loop()


def run(coroutine):
    """One event loop for the whole module: a Converse call opened in one scenario is used in the next."""
    return _LOOP.run_until_complete(coroutine)
