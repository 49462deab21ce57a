"""A property-based fuzz of every request field of the gateway's public RPC (Synthesize) against a live
gateway: every call ends as a well-formed stream (metadata, audio tiling the stream, summary last) or with a
clean status (INVALID_ARGUMENT naming a field, or RESOURCE_EXHAUSTED for an oversized message), and the
gateway and its stages stay healthy, with nothing left running."""

from __future__ import annotations

import asyncio

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from conftest import metric_value, scrape
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
        fields = {"first_chunk_tokens": draw(optional(int32)), "chunk_tokens": draw(optional(int32)),
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


def test_after_the_fuzz_everything_is_healthy_and_idle(stack):
    for service in ("gateway", "llm", "vocoder"):
        assert is_serving(stack.target(service))
    text = {s: scrape(stack.ports.metrics[s]) for s in ("gateway", "llm", "vocoder")}
    assert metric_value(text["gateway"], "gateway_active_requests") == 0
    assert metric_value(text["vocoder"], "vocoder_active_streams") == 0
    assert metric_value(text["llm"], "llm_requests_running") == 0
    assert metric_value(text["llm"], "llm_kv_blocks_used") == 0  # (a one-shot turn keeps no session)
