"""The HTTP door's WebSocket /v1/converse: Converse for browsers, driven by aiohttp's client. A session's
turns and history, barge-in, a spoken turn, bad frames, the API key as a query parameter, and nothing held after a
session ends however it ends."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time

import aiohttp
import pytest
from conftest import left_held, metric_value, own_gateway, scrape
from speech import pcm16, spoken

KEY = "alpha"
SAMPLING = {"max_new_tokens": 24, "min_new_tokens": 24, "seed": 1}
LONG = {"max_new_tokens": 2000, "min_new_tokens": 2000}


@pytest.fixture(scope="module")
def gateway(stack, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(KEY + "\n")
    with own_gateway(stack, tmp_path_factory.mktemp("logs"), "--api-keys-file", str(keys),
                     "--encoder-target", stack.target("encoder"), http=True) as gw:
        yield gw


def url(gw, key: str | None = KEY) -> str:
    return f"http://127.0.0.1:{gw.http}/v1/converse" + (f"?api_key={key}" if key else "")


async def send(ws, **message) -> None:
    await ws.send_str(json.dumps(message))


async def reply(ws) -> tuple[list[dict], bytes]:
    """A turn's frames to its summary (or its end otherwise: cancelled, failed, an error) → (JSON frames, audio)."""
    frames, audio = [], b""
    while True:
        msg = await asyncio.wait_for(ws.receive(), 60)
        if msg.type == aiohttp.WSMsgType.BINARY:
            audio += msg.data
            continue
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        frames.append(json.loads(msg.data))
        if frames[-1].keys() & {"summary", "cancelled", "failed", "error", "ended"}:
            return frames, audio


def settled(gw, stack) -> None:
    deadline = time.monotonic() + 20
    while any((held := left_held(gw, stack)).values()):
        assert time.monotonic() < deadline, f"still held: {held}"
        time.sleep(0.05)


def test_a_session_of_turns_with_history_then_closed(gateway, stack):
    before = metric_value(scrape(gateway.metrics), "gateway_ttfa_seconds_count", '{protocol="websocket"}')

    async def session():
        async with aiohttp.ClientSession() as http, http.ws_connect(url(gateway)) as ws:
            await send(ws, config={"voice": "default", "sampling": SAMPLING})
            started = await ws.receive_json(timeout=30)
            assert started["session"]["session_id"]
            turns = []
            for n, text in enumerate(["Hello there.", "And then?"], start=1):
                await send(ws, turn={"text": text})
                frames, audio = await reply(ws)
                meta, summary = frames[0], frames[-1]
                assert meta["turn"] == n and meta["metadata"]["sample_rate"] == 24000
                assert meta["metadata"]["format"] == "AUDIO_FORMAT_PCM16"
                assert summary["turn"] == n and int(summary["summary"]["num_samples"]) * 2 == len(audio) == 24 * 1920 * 2
                turns.append(summary["summary"])
            assert turns[1]["prompt_tokens"] > turns[0]["prompt_tokens"]  # the second turn carries the first
            await send(ws, close={})
            ended = await ws.receive_json(timeout=30)
            assert ended["ended"]["reason"] == "SESSION_END_REASON_CLOSED"
            assert (await ws.receive(timeout=10)).type == aiohttp.WSMsgType.CLOSE

    asyncio.run(session())
    settled(gateway, stack)
    assert metric_value(scrape(gateway.metrics), "gateway_ttfa_seconds_count", '{protocol="websocket"}') == before + 2


def test_barge_in_stops_the_reply_and_the_session_goes_on(gateway, stack):
    async def session():
        async with aiohttp.ClientSession() as http, http.ws_connect(url(gateway)) as ws:
            await send(ws, config={"voice": "default"})
            await ws.receive_json(timeout=30)
            await send(ws, turn={"text": "Talk for a long time.", "sampling": LONG})
            while (await asyncio.wait_for(ws.receive(), 30)).type != aiohttp.WSMsgType.BINARY:
                pass  # its metadata, then its first audio
            await send(ws, cancel={})
            frames, _ = await reply(ws)
            assert frames[-1]["turn"] == 1 and "cancelled" in frames[-1]
            await send(ws, turn={"text": "Short now.", "sampling": SAMPLING})
            frames, audio = await reply(ws)  # no audio of turn 1 after its cancel: turn 2's alone
            assert frames[0]["turn"] == 2 and "metadata" in frames[0] and len(audio) == 24 * 1920 * 2

    asyncio.run(session())
    settled(gateway, stack)


def test_a_spoken_turn_over_the_websocket(gateway, stack):
    samples, rate = spoken("What is the weather like today?")

    async def session():
        async with aiohttp.ClientSession() as http, http.ws_connect(url(gateway)) as ws:
            await send(ws, config={"voice": "default", "sampling": SAMPLING})
            await ws.receive_json(timeout=30)
            await send(ws, speech={"sample_rate": rate, "format": "AUDIO_FORMAT_PCM16"})
            pcm = pcm16(samples)
            for i in range(0, len(pcm), 3200):
                await ws.send_bytes(pcm[i:i + 3200])
            await send(ws, end_of_speech={})
            frames, audio = await reply(ws)
            ended = next(f for f in frames if "speech_ended" in f)
            assert ended["turn"] == 1 and ended["speech_ended"]["codes"] > 0
            assert abs(ended["speech_ended"]["audio_seconds"] - len(samples) / rate) < 0.1
            assert "summary" in frames[-1] and len(audio) == 24 * 1920 * 2

    asyncio.run(session())
    settled(gateway, stack)


@pytest.mark.parametrize("first, code, says", [
    ("not json at all", "INVALID_ARGUMENT", "not a ConverseRequest in JSON"),
    ('{"turn": {"text": "no config first"}}', "INVALID_ARGUMENT", "must be a config"),
    ('{"config": {"voice": "nobody"}}', "INVALID_ARGUMENT", "unknown voice 'nobody'"),
    ('{"config": {}, "flavour": 1}', "INVALID_ARGUMENT", 'no field named "flavour"'),
])
def test_a_bad_frame_ends_the_session_with_an_error_then_a_close(gateway, stack, first, code, says):
    async def session():
        async with aiohttp.ClientSession() as http, http.ws_connect(url(gateway)) as ws:
            await ws.send_str(first)
            error = await ws.receive_json(timeout=30)
            assert error["error"]["code"] == code and says in error["error"]["message"], error
            closing = await ws.receive(timeout=10)
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1008

    asyncio.run(session())
    settled(gateway, stack)


def test_bad_frames_mid_session_end_it_and_a_good_session_beside_it_goes_on(gateway, stack):
    async def bad():
        async with aiohttp.ClientSession() as http, http.ws_connect(url(gateway)) as ws:
            await send(ws, config={})
            await ws.receive_json(timeout=30)
            await ws.send_bytes(b"\x00\x01 audio with no speech open")  # a failed spoken turn: the session goes on
            frames, _ = await reply(ws)
            assert frames[-1]["failed"]["code"] == "INVALID_ARGUMENT" and "no speech is open" in frames[-1]["failed"]["message"]
            await ws.send_str('{"turn": {"text": ""}}')  # bad input: the session ends
            error = await ws.receive_json(timeout=30)
            assert error["error"]["param"] == "turn.text"

    async def good():
        async with aiohttp.ClientSession() as http, http.ws_connect(url(gateway)) as ws:
            await send(ws, config={"sampling": SAMPLING})
            await ws.receive_json(timeout=30)
            await send(ws, turn={"text": "Fine, thanks."})
            frames, audio = await reply(ws)
            assert "summary" in frames[-1] and audio

    async def both():
        await asyncio.gather(bad(), good())

    asyncio.run(both())
    settled(gateway, stack)


def test_the_key_comes_as_a_header_or_a_query_parameter(gateway):
    async def session():
        async with aiohttp.ClientSession() as http:
            for target, headers in [(url(gateway, None), {}), (url(gateway, "wrong"), {})]:
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await http.ws_connect(target, headers=headers)
                assert refused.value.status == 401
            async with http.ws_connect(url(gateway, None), headers={"Authorization": f"Bearer {KEY}"}) as ws:
                await send(ws, config={})
                assert "session" in await ws.receive_json(timeout=30)

    asyncio.run(session())


def test_a_client_that_leaves_mid_reply_leaves_nothing_behind(gateway, stack):
    async def session():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(url(gateway))
            await send(ws, config={})
            await ws.receive_json(timeout=30)
            await send(ws, turn={"text": "A long story.", "sampling": LONG})
            while (await asyncio.wait_for(ws.receive(), 30)).type != aiohttp.WSMsgType.BINARY:
                pass
            await ws.close()

    asyncio.run(session())
    settled(gateway, stack)
    text = scrape(gateway.metrics)
    assert metric_value(text, "gateway_active_sessions") == 0


def raw_client(port: int, *texts: str) -> socket.socket:
    """A WebSocket client by hand on a socket with a tiny receive window: the handshake, `texts` as masked text
    frames (RFC 6455 §5.2), then nothing read, ever."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET /v1/converse HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    for text in texts:
        data, mask = text.encode(), os.urandom(4)
        length = bytes([0x80 | len(data)]) if len(data) < 126 else bytes([0x80 | 126]) + struct.pack(">H", len(data))
        sock.sendall(bytes([0x81]) + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
    return sock


def test_a_client_that_stops_reading_is_ended(stack, tmp_path):
    """A session whose client takes no frames is ended after --client-stall-seconds (1 here), as a gRPC client is,
    and everything it held is freed."""
    with own_gateway(stack, tmp_path, "--client-stall-seconds", "1", http=True) as gw:
        stalled = '{method="websocket"}'
        turn = json.dumps({"turn": {"text": "Never listened to.", "sampling": LONG}})
        with raw_client(gw.http, json.dumps({"config": {}}), turn):
            deadline = time.monotonic() + 60
            while metric_value(scrape(gw.metrics), "gateway_stalled_calls_total", stalled) < 1:
                assert time.monotonic() < deadline, "the silent WebSocket client was not ended"
                time.sleep(0.1)
            settled(gw, stack)
