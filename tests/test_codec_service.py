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
from services.stack import NO_SPEECH, Ports, Stack, free_port
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
    with Stack(Ports.free(), without=NO_SPEECH, extra_args=args, log_dir=tmp_path_factory.mktemp("codec-stack-logs")) as s:
        yield s


def test_vocoder_lists_its_voices(codec_stack):
    with grpc.insecure_channel(codec_stack.target("vocoder")) as channel:
        reply = vocoder_pb2_grpc.VocoderStub(channel).ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=10)
    assert list(reply.voices) == ["alto", "default"]


def test_the_gateway_runs_no_more_turns_than_the_vocoder_has_stream_slots(codec_stack, tmp_path):
    """The vocoder says in ListVoices how many streams its flow's stream history holds (sized to its device's memory,
    or as given); the gateway (--max-turns 256 by default) then admits no more turns at once than that. A vocoder
    without a history (codec_stack's two voices share no prompt prefix) sets no limit."""
    from conftest import metric_value, scrape

    def slots_and_limit(s):
        with grpc.insecure_channel(s.target("vocoder")) as channel:
            reply = vocoder_pb2_grpc.VocoderStub(channel).ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=10)
        return reply.stream_slots, metric_value(scrape(s.ports.metrics["gateway"]), "gateway_admission_limit")

    assert slots_and_limit(codec_stack) == (0, 256)
    with Stack(Ports.free(), without=NO_SPEECH, log_dir=tmp_path,
               extra_args={"vocoder": ["--preset", "tiny-codec", "--flow-history-streams", "3"]}) as small:
        assert slots_and_limit(small) == (3, 3)
        assert "admission: at most 3 turns running (the vocoders' 3 stream slots, under --max-turns 256)" in \
            (tmp_path / "gateway.log").read_text()


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


@pytest.mark.parametrize(("solve", "lane"), [("off", "off"), ("on", "off"), ("off", "on")], ids=["calls", "solve", "lane"])
def test_cancelled_streams_give_their_history_slots_back(tmp_path, solve, lane):
    """A vocoder alone on the tiny-codec preset with a voice that has a prompt prefix (its streams keep their solved
    frames), 3 slots for 4 streams: all 3 are held once the streams' first chunks are decoded, and every one comes
    back, whether its stream ended, was cancelled mid-way, or broke off without an end, as its /metrics shows; with
    flow calls, with the solve batched at the Euler step (--flow-solve on: the fourth stream is decoded over its
    window beside it), and with first chunks on a lane of their own (--first-chunk-lane on, as moss-serve up runs a
    GPU: a stream's first chunk on one worker, the rest on the other)."""
    from conftest import metric_value, scrape

    save_voice(random_voice(tiny().flow, "default", prompt_tokens=10, seed=1), tmp_path)
    stack = Stack(Ports.free(), without=NO_SPEECH, extra_args={"vocoder": ["--preset", "tiny-codec", "--voices-dir", str(tmp_path),
                                                        "--flow-history-streams", "3", "--flow-solve", solve,
                                                        "--first-chunk-lane", lane]},
                  log_dir=tmp_path / "logs")

    def held() -> float:
        return metric_value(scrape(stack.ports.metrics["vocoder"]), "vocoder_flow_history_streams")

    async def stream(tokens: int, end: bool, go: asyncio.Event, cancel_after: int | None = None) -> int:
        """One Vocode call: config, chunks of 8 tokens (after the first, once `go` is set), then the end (or not: it
        holds its side open); cancelled after `cancel_after` replies (the header among them), once `go` is set."""
        async with grpc.aio.insecure_channel(stack.target("vocoder")) as channel:
            async def requests():
                yield vocoder_pb2.VocodeRequest(config=vocoder_pb2.VocodeConfig())
                for at in range(0, tokens, 8):
                    yield vocoder_pb2.VocodeRequest(tokens=vocoder_pb2.AudioTokens(tokens=list(range(at, at + 8))))
                    await go.wait()
                if end:
                    yield vocoder_pb2.VocodeRequest(end=vocoder_pb2.EndOfTokens())
                else:
                    await asyncio.sleep(30)  # the call is cancelled under it

            call = vocoder_pb2_grpc.VocoderStub(channel).Vocode(requests(), timeout=30)
            replies = 0
            async for _ in call:
                replies += 1
                if cancel_after is not None and replies >= cancel_after and go.is_set():  # (not before all are held)
                    call.cancel()
                    break
            return replies

    async def held_then_go(go: asyncio.Event) -> float:
        """Polls until 3 slots are held (up to 20 s), then lets the streams go on."""
        seen = 0.0
        for _ in range(400):
            seen = await asyncio.to_thread(held)
            if seen == 3:
                break
            await asyncio.sleep(0.05)
        go.set()
        return seen

    async def four_streams():
        go = asyncio.Event()
        return await asyncio.gather(stream(24, True, go), stream(40, False, go, cancel_after=2),
                                    stream(40, False, go, cancel_after=3), stream(16, True, go), held_then_go(go))

    try:
        stack.start("vocoder")
        stack.wait_serving(["vocoder"])
        assert metric_value(scrape(stack.ports.metrics["vocoder"]), "vocoder_flow_history_slots") == 3
        *replies, most = asyncio.run(four_streams())
        assert all(r >= 2 for r in replies) and most == 3
        ready = asyncio.Event()
        ready.set()
        for _ in range(100):  # a slot is freed once no call writes it: at a later call, or when read (a scrape)
            if held() == 0:
                break
            asyncio.run(stream(8, True, ready))
        assert held() == 0
        text = scrape(stack.ports.metrics["vocoder"])
        ticks = metric_value(text, "vocoder_flow_tick_rows_count")
        assert (ticks > 0) == (solve == "on"), ticks
        # the lane's calls apart, counted among every call too: every stream's first chunk went there, the rest not
        calls, lane_calls = (metric_value(text, f"vocoder_{m}_seconds_count") for m in ("batch", "lane_batch"))
        lane_windows = metric_value(text, "vocoder_lane_batch_size_sum")
        if lane == "on":
            assert 4 <= lane_windows and 1 <= lane_calls <= lane_windows and lane_calls < calls, (lane_calls, calls)
        else:
            assert lane_calls == lane_windows == 0
    finally:
        stack.stop_all()


def test_a_seeded_reply_is_the_same_audio_again_and_differs_by_the_flow_steps_alone(codec_stack, voices_dir,
                                                                                    tmp_path_factory):
    """docs/running.md's way to hear `--flow-steps`: the same seeded reply from two stacks. Asked twice, one stack gives the
    same samples (the llm's seeded tokens, the flow's fixed noise table, HiFT's fixed source noise); a stack with
    fewer Euler steps gives as many samples, and other ones."""
    def say(stack):
        return asyncio.run(synthesize(stack.target("gateway"), "Say something.", sampling=SAMPLING))

    first, again = say(codec_stack), say(codec_stack)
    assert np.array_equal(first.samples, again.samples)
    args = {"vocoder": ["--preset", "tiny-codec", "--voices-dir", str(voices_dir), "--flow-steps", "5"]}
    with Stack(Ports.free(), without=NO_SPEECH, extra_args=args, log_dir=tmp_path_factory.mktemp("steps5-logs")) as fewer:
        coarser = say(fewer)
    assert len(coarser.samples) == len(first.samples) == 24 * 1920
    assert not np.array_equal(coarser.samples, first.samples)
    assert np.abs(coarser.samples).max() > 0
