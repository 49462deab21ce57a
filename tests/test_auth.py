"""API keys at the gateway: missing, malformed and wrong keys are UNAUTHENTICATED before any work; a right key
(from the file or the environment) goes through; health checking stays open; clients send the key."""

import asyncio
import collections
import os
import subprocess
import sys

import grpc
import pytest
from conftest import gateway_stack, metric_value, scrape
from grpc_health.v1 import health_pb2, health_pb2_grpc
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.common.auth import load_keys
from services.gateway.client import converse, synthesize

SAMPLING = common_pb2.SamplingParams(max_new_tokens=4, seed=1)


@pytest.fixture(scope="module")
def keyed_stack(stack, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# the gateway's keys\nfile-key-1\n\nfile-key-2\n")
    with gateway_stack(stack, tmp_path_factory.mktemp("logs"), "--api-keys-file", str(keys),
                       env={"MOSS_API_KEYS": "env-key"}) as keyed:
        yield keyed


def call(target: str, metadata=()) -> grpc.aio.AioRpcError | list:
    async def run():
        async with grpc.aio.insecure_channel(target) as channel:
            request = gateway_pb2.SynthesizeRequest(text="hi", sampling=SAMPLING)
            return [m async for m in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=30, metadata=metadata)]

    try:
        return asyncio.run(run())
    except grpc.aio.AioRpcError as err:
        return err


@pytest.mark.parametrize("metadata, why", [
    ((), "missing authorization"),
    ((("authorization", "file-key-1"),), "must be 'Bearer <API key>'"),
    ((("authorization", "Basic file-key-1"),), "must be 'Bearer <API key>'"),
    ((("authorization", "Bearer file-key-"),), "invalid API key"),   # a prefix of a right key
    ((("authorization", "Bearer file-key-10"),), "invalid API key"),
    ((("authorization", "Bearer # the gateway's keys"),), "invalid API key"),  # a comment is not a key
])
def test_wrong_keys_are_unauthenticated(keyed_stack, metadata, why):
    err = call(keyed_stack.target("gateway"), metadata)
    assert isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.UNAUTHENTICATED, err
    assert why in err.details()


@pytest.mark.parametrize("key", ["file-key-1", "file-key-2", "env-key"])
def test_right_keys_go_through(keyed_stack, key):
    messages = call(keyed_stack.target("gateway"), (("authorization", f"Bearer {key}"),))
    assert not isinstance(messages, grpc.aio.AioRpcError), messages
    assert messages[-1].summary.audio_tokens > 0


def test_health_stays_open_and_refusals_are_counted(keyed_stack):
    with grpc.insecure_channel(keyed_stack.target("gateway")) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    for _ in range(10):  # counted before its status goes out: the scrape right after the refusal sees it, every time
        before = metric_value(scrape(keyed_stack.ports.metrics["gateway"]), "gateway_requests_total", '{code="UNAUTHENTICATED"}')
        call(keyed_stack.target("gateway"))
        after = metric_value(scrape(keyed_stack.ports.metrics["gateway"]), "gateway_requests_total", '{code="UNAUTHENTICATED"}')
        assert after == before + 1


def test_clients_send_the_key(keyed_stack, tmp_path):
    result = asyncio.run(synthesize(keyed_stack.target("gateway"), "hi", sampling=SAMPLING, api_key="env-key"))
    assert result.summary.audio_tokens > 0
    say = [sys.executable, "-m", "services.cli", "say", "hi", "--target", keyed_stack.target("gateway"),
           "--max-new-tokens", "4", "-o", str(tmp_path / "a.wav")]
    env = {k: v for k, v in os.environ.items() if k != "MOSS_API_KEY"}
    ok = subprocess.run(say, capture_output=True, text=True, env={**env, "MOSS_API_KEY": "file-key-2"})
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(say, capture_output=True, text=True, env=env)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr


def test_a_key_file_without_keys_is_an_error(tmp_path):
    empty = tmp_path / "keys.txt"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(ValueError, match="no API key"):
        load_keys(str(empty))
    with pytest.raises(OSError):
        load_keys(str(tmp_path / "missing.txt"))


def test_refused_conversations_are_unauthenticated_every_time(keyed_stack):
    """A Converse client writes its config as the call opens; refused before that write landed, it saw gRPC core's
    bare INTERNAL in 18 of 200 tries. The refusal takes the first message first."""
    async def many(n: int) -> collections.Counter:
        codes = collections.Counter()
        for _ in range(n):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async with converse(keyed_stack.target("gateway"), timeout=10) as conv:
                    await conv.say("hi")
            codes[info.value.code()] += 1
        return codes

    assert asyncio.run(many(60)) == {grpc.StatusCode.UNAUTHENTICATED: 60}
