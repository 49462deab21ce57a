"""A property-based fuzz of every request field of the gateway's public RPCs against a live gateway.
Synthesize: every call ends as a well-formed stream (metadata, audio tiling the stream, summary last) or
with a clean status (INVALID_ARGUMENT naming a field). Converse: any sequence of messages (configs, turns,
cancels, closes, empty ones, in any order) ends as a well-formed conversation (session first, each turn's
messages in order, ending in its summary or its cancel, ended last) or with INVALID_ARGUMENT naming a field.
Afterwards the gateway and its stages are healthy, with nothing left running."""

from __future__ import annotations

import asyncio
import time

import grpc
from conftest import metric_value, scrape
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.stack import is_serving

FIELDS = ("text", "voice", "format", "sampling.", "chunking.")
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([0.0, -0.0, 1e-6, 1.0, 2.0, 10.0]))
int32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-2, 300))


def optional(strategy):
    return st.one_of(st.none(), strategy)


@st.composite
def requests(draw) -> gateway_pb2.SynthesizeRequest:
    req = gateway_pb2.SynthesizeRequest(
        text=draw(st.one_of(st.text(max_size=40), st.sampled_from(["", "   ", "hi", "x" * 2001]))),
        voice=draw(st.one_of(st.just(""), st.just("default"), st.text(max_size=10))),
        format=draw(st.one_of(st.sampled_from([0, 1, 2]), st.integers(-5, 2**31 - 1))),
    )
    if draw(st.booleans()):
        fields = {"temperature": draw(optional(floats)), "top_p": draw(optional(floats)), "top_k": draw(optional(int32)),
                  "repetition_penalty": draw(optional(floats)), "max_new_tokens": draw(optional(st.integers(-3, 12))),
                  "min_new_tokens": draw(optional(st.integers(-3, 12))), "seed": draw(optional(st.integers(0, 2**64 - 1)))}
        req.sampling.CopyFrom(common_pb2.SamplingParams(**{k: v for k, v in fields.items() if v is not None}))
    else:  # keep the replies short
        req.sampling.max_new_tokens = 4
    if draw(st.booleans()):
        fields = {"first_chunk_tokens": draw(optional(int32)), "second_chunk_tokens": draw(optional(int32)),
                  "chunk_tokens": draw(optional(int32)),
                  "lookahead_frames": draw(optional(int32))}
        req.chunking.CopyFrom(common_pb2.ChunkPolicy(**{k: v for k, v in fields.items() if v is not None}))
    return req


async def call(target: str, request) -> tuple[list, grpc.aio.AioRpcError | None]:
    async with grpc.aio.insecure_channel(target) as channel:
        messages = []
        try:
            async for msg in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=60):
                messages.append(msg)
        except grpc.aio.AioRpcError as err:
            return messages, err
        return messages, None


def check_stream(messages: list) -> None:
    kinds = [m.WhichOneof("kind") for m in messages]
    assert kinds[0] == "metadata" and kinds[-1] == "summary" and set(kinds[1:-1]) <= {"audio"}, kinds
    meta, summary = messages[0].metadata, messages[-1].summary
    width = 2 if meta.format == common_pb2.AUDIO_FORMAT_PCM16 else 4
    offset = 0
    for m in messages[1:-1]:
        assert m.audio.sample_offset == offset and len(m.audio.pcm) == m.audio.num_samples * width
        offset += m.audio.num_samples
    assert offset == summary.num_samples


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=requests())
def test_every_request_is_a_stream_or_a_clean_status(stack, request):
    messages, err = asyncio.run(call(stack.target("gateway"), request))
    if err is None:
        check_stream(messages)
        return
    assert not messages or messages[0].WhichOneof("kind") == "metadata"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details(), request)
    assert any(err.details().startswith(f) for f in FIELDS), err.details()


@st.composite
def conversations(draw) -> list[gateway_pb2.ConverseRequest]:
    def config():
        r = draw(requests())
        return gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(
            voice=r.voice, format=r.format, sampling=r.sampling, chunking=r.chunking,
            system_prompt=draw(st.one_of(st.just(""), st.text(max_size=20), st.just("x" * 2001)))))

    def turn():
        r = draw(requests())
        return gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(
            text=r.text, sampling=r.sampling if draw(st.booleans()) else None))

    makers = {"config": config, "turn": turn, "cancel": lambda: gateway_pb2.ConverseRequest(cancel=gateway_pb2.CancelTurn()),
              "close": lambda: gateway_pb2.ConverseRequest(close=gateway_pb2.CloseSession()),
              "empty": gateway_pb2.ConverseRequest}
    first = draw(st.sampled_from(["config"] * 4 + list(makers)))
    rest = draw(st.lists(st.sampled_from(["turn", "turn", "cancel", "close", "config", "empty"]), max_size=4))
    return [makers[kind]() for kind in [first, *rest]]


async def converse_call(target: str, messages) -> tuple[list, grpc.aio.AioRpcError | None]:
    async with grpc.aio.insecure_channel(target) as channel:
        replies = []
        try:
            async for msg in gateway_pb2_grpc.GatewayStub(channel).Converse(iter(messages), timeout=60):
                replies.append(msg)
        except grpc.aio.AioRpcError as err:
            return replies, err
        return replies, None


def check_conversation(replies: list, ended: bool) -> None:
    kinds = [m.WhichOneof("kind") for m in replies]
    if not kinds:
        return
    assert kinds[0] == "session" and "session" not in kinds[1:], kinds
    if ended:
        assert kinds[-1] == "ended" and "ended" not in kinds[:-1], kinds
    turns: dict[int, list] = {}
    for m in replies[1:]:
        if m.WhichOneof("kind") != "ended":
            turns.setdefault(m.turn, []).append(m)
    for n, messages in turns.items():
        ks = [m.WhichOneof("kind") for m in messages]
        if "cancelled" in ks:  # whatever had come of it, then its cancel, then nothing of it
            assert ks[-1] == "cancelled" and ks.count("cancelled") == 1 and "summary" not in ks, (n, ks)
            ks = ks[:-1]
        elif ended:  # a turn that was not cancelled finished before the session ended
            assert ks[-1] == "summary", (n, ks)
        assert not ks or ks[0] == "metadata", (n, ks)
        assert set(ks[1:]) <= {"audio", "text", "summary"} and ks.count("summary") <= 1 and "summary" not in ks[:-1], (n, ks)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=conversations())
def test_every_conversation_is_well_formed_or_a_clean_status(stack, messages):
    sent = lambda code: metric_value(scrape(stack.ports.metrics["gateway"]), "gateway_requests_total", f'{{code="{code}"}}')  # noqa: E731
    refused_before, internal_before = sent("INVALID_ARGUMENT"), sent("INTERNAL")
    replies, err = asyncio.run(converse_call(stack.target("gateway"), messages))
    check_conversation(replies, ended=err is None)
    if err is None:
        return
    if err.code() == grpc.StatusCode.INTERNAL and err.details() == "Internal error from Core":
        # The client was still sending when the gateway ended the call: gRPC's client then reports its own
        # failed send, not the status the gateway sent. The gateway's count says which status that was.
        deadline = time.monotonic() + 2
        while sent("INVALID_ARGUMENT") == refused_before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sent("INVALID_ARGUMENT") == refused_before + 1 and sent("INTERNAL") == internal_before
        return
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details(), messages)
    assert any(err.details().startswith(f) for f in ("config", "turn.", "kind")), err.details()


def test_after_the_fuzz_everything_is_healthy_and_idle(stack):
    for service in ("gateway", "llm", "vocoder"):
        assert is_serving(stack.target(service))
    text = {s: scrape(stack.ports.metrics[s]) for s in ("gateway", "llm", "vocoder")}
    deadline = time.monotonic() + 5  # the llm forgets a session a moment after its call ends
    while metric_value(scrape(stack.ports.metrics["llm"]), "llm_sessions") and time.monotonic() < deadline:
        time.sleep(0.1)
    text = {s: scrape(stack.ports.metrics[s]) for s in ("gateway", "llm", "vocoder")}
    assert metric_value(text["gateway"], "gateway_active_requests") == 0
    assert metric_value(text["gateway"], "gateway_active_sessions") == 0
    assert metric_value(text["vocoder"], "vocoder_active_streams") == 0
    assert metric_value(text["llm"], "llm_requests_running") == 0
    assert metric_value(text["llm"], "llm_sessions") == 0
    assert metric_value(text["llm"], "llm_kv_blocks_used") == 0  # (every session was forgotten)
