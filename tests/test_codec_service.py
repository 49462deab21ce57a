"""The codec decoder in the running services: a vocoder on the tiny-codec preset (flow + HiFT) with a voices
directory, behind a gateway, as real processes on free loopback ports."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc
import numpy as np
import pytest
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, vocoder_pb2, vocoder_pb2_grpc

from services.gateway.client import synthesize
from services.stack import Ports, Stack, free_port
from services.vocoder.codec.config import tiny
from services.vocoder.codec.voice import random_voice, save_voice

SAMPLING = common_pb2.SamplingParams(max_new_tokens=24, min_new_tokens=24, seed=3)


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("voices")
    save_voice(random_voice(tiny().flow, "default", prompt_tokens=10, seed=1), path)
    save_voice(random_voice(tiny().flow, "alto", prompt_tokens=7, seed=2), path)
    return path


@pytest.fixture(scope="module")
def codec_stack(voices_dir, tmp_path_factory):
    args = {"vocoder": ["--preset", "tiny-codec", "--voices-dir", str(voices_dir)]}
    with Stack(Ports.free(), extra_args=args, log_dir=tmp_path_factory.mktemp("codec-stack-logs")) as s:
        yield s


def test_vocoder_lists_its_voices(codec_stack):
    with grpc.insecure_channel(codec_stack.target("vocoder")) as channel:
        reply = vocoder_pb2_grpc.VocoderStub(channel).ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=10)
    assert list(reply.voices) == ["alto", "default"]


def test_each_voice_speaks_every_token(codec_stack):
    """Every token becomes 80 ms of audio through flow blocks and HiFT windows, and the voices differ."""
    results = {voice: asyncio.run(synthesize(codec_stack.target("gateway"), "Say something.", voice=voice,
                                             sampling=SAMPLING)) for voice in ("", "alto")}
    for result in results.values():
        s = result.summary
        assert s.audio_tokens == 24 and len(result.samples) == 24 * 1920 == s.num_samples
        assert np.abs(result.samples).max() > 0 and len(result.chunks) >= 2
    # The same seed gives the same tokens: the voices' prompts and x-vectors make the difference.
    assert not np.array_equal(results[""].samples, results["alto"].samples)


def test_an_unknown_voice_is_refused_listing_the_known_ones(codec_stack):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(synthesize(codec_stack.target("gateway"), "Hello", voice="tenor", sampling=SAMPLING))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "voice: unknown voice 'tenor'; known voices: alto, default"

    async def converse_with(voice: str):
        async with grpc.aio.insecure_channel(codec_stack.target("gateway")) as channel:
            call = gateway_pb2_grpc.GatewayStub(channel).Converse(iter([gateway_pb2.ConverseRequest(
                config=gateway_pb2.SessionConfig(voice=voice))]), timeout=10)
            return [m async for m in call]

    with pytest.raises(grpc.aio.AioRpcError) as err:
        asyncio.run(converse_with("tenor"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.voice: unknown voice 'tenor'; known voices: alto, default" in err.value.details()
    # The vocoder refuses it too, for a client that reaches it directly.
    with grpc.insecure_channel(codec_stack.target("vocoder")) as channel:
        call = vocoder_pb2_grpc.VocoderStub(channel).Vocode(
            iter([vocoder_pb2.VocodeRequest(config=vocoder_pb2.VocodeConfig(voice="tenor"))]), timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            list(call)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "config.voice: unknown voice 'tenor'" in err.value.details()


def test_a_bad_voices_directory_stops_the_vocoder_at_start_naming_the_file(tmp_path):
    (tmp_path / "broken.safetensors").write_bytes(b"\x00 not a voice")
    proc = subprocess.run([sys.executable, "-m", "services.cli", "vocoder", "--port", str(free_port()),
                           "--metrics-port", str(free_port()), "--preset", "tiny-codec", "--voices-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "cannot start" in proc.stderr and "broken.safetensors: not a readable safetensors file" in proc.stderr
