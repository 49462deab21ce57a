"""Every error a door sends is at most 1 kB, whatever the client sent: a client's value is quoted cut to 64
characters with its length named (services/common/errors.py), on gRPC, HTTP and the WebSocket alike. A 15 kB voice
name once overflowed gRPC's status header (RESOURCE_EXHAUSTED "received metadata size exceeds soft limit" instead
of INVALID_ARGUMENT), and a 900 kB one came back whole over HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import aiohttp
import grpc
import pytest
from conftest import own_gateway
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.common.errors import MAX_MESSAGE_BYTES, InvalidArgument, clip, echo, listed

HUGE = "v" * 15_000
SHORT = common_pb2.SamplingParams(max_new_tokens=4)


@pytest.fixture(scope="module")
def gateway(stack, tmp_path_factory):
    with own_gateway(stack, tmp_path_factory.mktemp("logs"), http=True) as gw:
        yield gw


def test_a_value_is_quoted_cut_and_a_message_is_bounded():
    assert echo("alto") == "'alto'"
    assert echo("x" * 1000) == f"{'x' * 64!r}... (1000 characters)"
    assert echo("\ud800bad") == "'\\ud800bad'"  # a lone surrogate is escaped: the message stays valid UTF-8
    assert listed(f"v{i}" for i in range(40)).endswith("v15 and 24 more")
    message = str(InvalidArgument("f" * 10_000, "é" * 10_000))
    assert len(message.encode()) <= MAX_MESSAGE_BYTES and message.endswith("bytes)") and "(cut from 2" in message
    assert message.startswith(f"{'f' * 64!r}... (10000 characters): \u00e9")
    assert clip("ok") == "ok" and len(clip("\U0001f600" * 500, 123).encode()) <= 123


@pytest.mark.parametrize("request_fields, field", [
    ({"voice": HUGE}, "voice"),
    ({"voice": "\u00e9" * 7_000}, "voice"),
])
def test_grpc_errors_are_bounded_and_keep_their_code(gateway, request_fields, field):
    async def call():
        async with grpc.aio.insecure_channel(gateway.target) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as synth:
                async for _ in stub.Synthesize(gateway_pb2.SynthesizeRequest(text="hi", sampling=SHORT,
                                                                              **request_fields), timeout=30):
                    pass
            converse = stub.Converse(timeout=30)
            await converse.write(gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig(**request_fields)))
            with pytest.raises(grpc.aio.AioRpcError) as conv:
                async for _ in converse:
                    pass
            return synth.value, conv.value

    for err in asyncio.run(call()):
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert field in err.details().split(":")[0] and len(err.details().encode()) <= MAX_MESSAGE_BYTES, err.details()
        assert "characters)" in err.details()


def post(gateway, body: dict) -> tuple[int, dict, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{gateway.http}/v1/audio/speech", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, {}, dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


BASE = {"model": "moss-speech", "input": "hi", "voice": "alloy"}


@pytest.mark.parametrize("change, status", [
    ({"voice": "v" * 900_000}, 400),
    ({"model": "m" * 900_000}, 404),
    ({"response_format": "f" * 900_000}, 400),
    ({"stream_format": "s" * 900_000}, 400),
    ({"k" * 900_000: 1}, 400),
    ({"sampling": {"k" * 900_000: 1}}, 400),
])
def test_http_errors_are_bounded(gateway, change, status):
    code, body, headers = post(gateway, {**BASE, **change})
    assert code == status, body
    message = body["error"]["message"]
    assert len(message.encode()) <= MAX_MESSAGE_BYTES and len(json.dumps(body).encode()) <= 2 * MAX_MESSAGE_BYTES, message
    assert body["error"]["param"] is None or len(body["error"]["param"]) <= 128
    assert headers.get("X-Content-Type-Options") == "nosniff"


@pytest.mark.parametrize("frame", [
    json.dumps({"config": {"voice": "v" * 500_000}}),
    json.dumps({"config": {}, "k" * 500_000: 1}),
])
def test_websocket_errors_are_bounded(gateway, frame):
    async def session():
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(f"http://127.0.0.1:{gateway.http}/v1/converse", max_msg_size=0) as ws:
            await ws.send_str(frame)
            error = await ws.receive_json(timeout=30)
            closing = await ws.receive(timeout=10)
            return error, closing

    error, closing = asyncio.run(session())
    assert error["error"]["code"] == "INVALID_ARGUMENT"
    assert len(error["error"]["message"].encode()) <= MAX_MESSAGE_BYTES, error
    assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1008 and len(closing.extra.encode()) <= 123
