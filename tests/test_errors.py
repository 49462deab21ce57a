"""Bad input gets INVALID_ARGUMENT naming the field; a stage that is down gets UNAVAILABLE naming it,
within the deadline, and the gateway serves again once the stage is back."""

import asyncio
import time

import grpc
import pytest
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, llm_pb2, llm_pb2_grpc

from services.gateway.client import synthesize
from services.stack import NO_SPEECH, Ports, Stack

OK_SAMPLING = common_pb2.SamplingParams(max_new_tokens=6, seed=1)


async def call(target, request, timeout=30.0):
    async with grpc.aio.insecure_channel(target) as channel:
        return [m async for m in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=timeout)]


def expect_status(target, request, code, *words, timeout=30.0):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(call(target, request, timeout))
    assert info.value.code() == code, info.value.details()
    for word in words:
        assert word in info.value.details(), info.value.details()
    return info.value


@pytest.mark.parametrize(
    "request_fields, field",
    [
        ({"text": ""}, "text"),
        ({"text": "   "}, "text"),
        ({"text": "x" * 2001}, "text"),
        ({"text": "hi", "voice": "nobody"}, "voice"),
        ({"text": "hi", "format": 7}, "format"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(temperature=-1)}, "sampling.temperature"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(temperature=5)}, "sampling.temperature"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(top_p=0)}, "sampling.top_p"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(top_p=1.5)}, "sampling.top_p"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(top_k=-3)}, "sampling.top_k"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(repetition_penalty=0)}, "sampling.repetition_penalty"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(max_new_tokens=0)}, "sampling.max_new_tokens"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(max_new_tokens=10**6)}, "sampling.max_new_tokens"),
        ({"text": "hi", "sampling": common_pb2.SamplingParams(max_new_tokens=5, min_new_tokens=9)}, "sampling.min_new_tokens"),
        ({"text": "hi", "chunking": common_pb2.ChunkPolicy(first_chunk_tokens=0)}, "chunking.first_chunk_tokens"),
        ({"text": "hi", "chunking": common_pb2.ChunkPolicy(second_chunk_tokens=300)}, "chunking.second_chunk_tokens"),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_field(stack, request_fields, field):
    expect_status(stack.target("gateway"), gateway_pb2.SynthesizeRequest(**request_fields), grpc.StatusCode.INVALID_ARGUMENT, field)


def test_llm_refuses_bad_token_prompts(stack):
    async def generate(req):
        async with grpc.aio.insecure_channel(stack.target("llm")) as channel:
            return [m async for m in llm_pb2_grpc.LlmStub(channel).Generate(req, timeout=30)]

    for req, field in [
        (llm_pb2.GenerateRequest(), "turn"),
        (llm_pb2.GenerateRequest(tokens=llm_pb2.PromptTokens(text=[1, 10**6])), "tokens.text"),
        (llm_pb2.GenerateRequest(text="hi", output_mode=9), "output_mode"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            asyncio.run(generate(req))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in info.value.details()


CORRUPT = b"\xff\xff\xff\xff"  # no protobuf message: a tag whose wire type does not exist
BAD_UTF8 = b"\x0a\x03a\xffb"     # field 1, a string in these requests, holding bytes that are not UTF-8


@pytest.mark.parametrize("service, method, streamed, data", [
    ("gateway", "/moss.speech.v1.Gateway/Synthesize", False, CORRUPT),
    ("gateway", "/moss.speech.v1.Gateway/Synthesize", False, BAD_UTF8),
    ("gateway", "/moss.speech.v1.Gateway/Converse", True, CORRUPT),
    ("llm", "/moss.speech.v1.Llm/Generate", False, BAD_UTF8),
    ("vocoder", "/moss.speech.v1.Vocoder/Vocode", True, CORRUPT),
])
def test_bytes_that_are_no_request_are_invalid_argument(stack, service, method, streamed, data):
    """A request a protobuf parser refuses ends INVALID_ARGUMENT saying so (grpc's own answer: UNKNOWN and a
    traceback in the log), whether it is a unary call's request or a stream's message after a good one."""
    first = gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig()).SerializeToString()
    with grpc.insecure_channel(stack.target(service)) as channel:
        if streamed:
            messages = [first, data] if method.endswith("Converse") else [data]
            call = channel.stream_stream(method)(iter(messages), timeout=30)
        else:
            call = channel.unary_stream(method)(data, timeout=30)
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details().startswith("request: not a message of its type (Error parsing message")


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory):
    """A stack of its own: these tests stop and restart stages (each test leaves it whole again)."""
    # --ready-wait 1: a request waits at most 1 s for a stopped stage before UNAVAILABLE
    with Stack(Ports.free(), without=NO_SPEECH, log_dir=tmp_path_factory.mktemp("logs"),
               extra_args={"gateway": ["--ready-wait", "1"]}) as s:
        yield s


@pytest.mark.parametrize("stage", ["llm", "vocoder"])
def test_stage_down_is_unavailable_then_recovers(own_stack, stage):
    gateway = own_stack.target("gateway")
    request = gateway_pb2.SynthesizeRequest(text="hello", sampling=OK_SAMPLING)
    assert asyncio.run(call(gateway, request))  # warm: channels connected
    own_stack.stop(stage)
    for _ in range(2):  # refused every time, quickly, well within the deadline
        start = time.monotonic()
        expect_status(gateway, request, grpc.StatusCode.UNAVAILABLE, stage, timeout=10.0)
        assert time.monotonic() - start < 5.0
    own_stack.start(stage)
    own_stack.wait_serving([stage])
    deadline = time.monotonic() + 10
    while True:  # the gateway reconnects within its 1 s backoff cap
        try:
            result = asyncio.run(synthesize(gateway, "hello again", sampling=OK_SAMPLING))
            break
        except grpc.aio.AioRpcError:
            assert time.monotonic() < deadline, "gateway did not recover"
            time.sleep(0.2)
    assert result.summary.num_samples == 6 * 1920


def test_a_stream_broken_under_a_write_is_the_stage_unavailable():
    """gRPC core's bare INTERNAL for a write that crossed the peer's death names the stage as unavailable; an
    INTERNAL the stage sent itself stays its own."""
    from services.common.errors import Unavailable
    from services.gateway.pipeline import BROKEN_STREAM, stage_error

    broken = stage_error("vocoder", grpc.StatusCode.INTERNAL, BROKEN_STREAM)
    assert isinstance(broken, Unavailable) and str(broken).startswith("vocoder unavailable")
    own = stage_error("vocoder", grpc.StatusCode.INTERNAL, "the generator failed")
    assert not isinstance(own, Unavailable) and "the generator failed" in str(own)


def test_a_write_that_crosses_the_turns_deadline_is_the_deadline_not_a_broken_stream():
    """gRPC core gives a write that crosses the call's deadline the same bare INTERNAL as one that crosses the peer's
    death (1.5-2% of writes made at the deadline on loopback). Read as a broken stream it marked a healthy vocoder
    down, and the next turns were refused UNAVAILABLE ('not ready ... within 0.0 s', a flaky tests/test_load_cleanup.py).
    Once the turn's time is up, the failure is the deadline's; before, it is still the stage's."""
    from services.common.errors import DeadlineExceeded, Unavailable
    from services.gateway.pipeline import BROKEN_STREAM, Turn
    from services.gateway.turn_request import TurnLimits

    class CrossedCall:  # a Vocode call whose write failed as core fails it; its own status is core's INTERNAL
        async def write(self):
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, None, None, details=BROKEN_STREAM)

        async def code(self):
            return grpc.StatusCode.INTERNAL

        async def details(self):
            return BROKEN_STREAM

    class NoPools:
        llm = vocoder = None

    def failure(timeout: float) -> Exception:
        turn = Turn(gateway_pb2.SynthesizeRequest(), NoPools(), TurnLimits(), timeout)
        call = CrossedCall()
        with pytest.raises(Exception) as info:
            asyncio.run(turn._vocoder_io(call, call.write()))
        return info.value

    assert isinstance(failure(-0.001), DeadlineExceeded)   # the turn's deadline has passed
    live = failure(30.0)                                   # a turn with time left: the vocoder went away under it
    assert isinstance(live, Unavailable) and "vocoder" in str(live)
