"""The three services as separate processes: a sentence in, streamed PCM out, every stage measured."""

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
import wave

import grpc
import numpy as np
import pytest
from conftest import UpProcess, metric_value, scrape
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.gateway.client import synthesize
from services.stack import Ports, is_serving
from services.vocoder.metrics import CALL_SIZES

SAMPLES_PER_TOKEN = 1920  # 80 ms at 24 kHz


def stage_counts(stack) -> dict[str, float]:
    gw, llm, voc = (scrape(stack.ports.metrics[s]) for s in ("gateway", "llm", "vocoder"))
    return {
        "gateway_ttfa": metric_value(gw, "gateway_ttfa_seconds_count", '{protocol="grpc"}'),
        "gateway_requests_ok": metric_value(gw, "gateway_requests_total", '{code="OK"}'),
        "gateway_audio_turns": metric_value(gw, "gateway_audio_turns_total", '{protocol="grpc"}'),  # the stall-free share's base
        "llm_prefill": metric_value(llm, "llm_prefill_seconds_count"),
        "llm_inter_token": metric_value(llm, "llm_inter_token_seconds_count"),
        "llm_first_audio": metric_value(llm, "llm_time_to_first_audio_token_seconds_count"),
        "vocoder_chunk": metric_value(voc, "vocoder_chunk_seconds_count"),
        "vocoder_first_chunk": metric_value(voc, "vocoder_first_chunk_seconds_count"),
        "gateway_second_chunk": metric_value(gw, "gateway_second_chunk_slack_seconds_count"),
    }


def test_synthesize_streams_speech_through_three_processes(stack):
    before = stage_counts(stack)
    sampling = common_pb2.SamplingParams(max_new_tokens=30, seed=11)
    result = asyncio.run(synthesize(stack.target("gateway"), "Hello! How is the weather today?", sampling=sampling))
    s = result.summary
    assert result.request_id and result.sample_rate == 24000 and result.format == common_pb2.AUDIO_FORMAT_PCM16
    assert len(result.chunks) >= 3, "audio should arrive in several chunks"
    # PCM well formed: whole 16-bit samples, contiguous offsets, not silent, within range
    sizes = [len(c) // 2 for c in result.chunks]
    assert all(len(c) % 2 == 0 for c in result.chunks)
    assert result.offsets == list(np.cumsum([0] + sizes[:-1]))
    samples = result.samples
    assert np.all(np.abs(samples) <= 1.0) and np.abs(samples).max() > 0
    # duration = audio tokens × 80 ms
    assert s.audio_tokens > 0 and len(samples) == s.audio_tokens * SAMPLES_PER_TOKEN == s.num_samples
    assert abs(s.audio_seconds - s.audio_tokens * 0.08) < 1e-9
    assert 0 < s.ttfa_seconds <= s.total_seconds and s.llm_prefill_seconds > 0 and s.vocoder_compute_seconds > 0
    # the llm's own part of the first chunk (its clock, from the request's arrival there) within the gateway's span of it
    assert s.llm_queue_seconds + s.llm_prefill_seconds <= s.llm_first_chunk_in_llm_seconds < s.llm_first_chunk_seconds
    # and the vocoder's part of first audio: its wait for a call and the call within its own span, within the gateway's
    assert 0 <= s.vocoder_first_chunk_queue_seconds and 0 < s.vocoder_first_chunk_seconds
    assert s.vocoder_first_chunk_queue_seconds + s.vocoder_first_chunk_seconds <= s.vocoder_first_chunk_in_vocoder_seconds
    assert s.llm_first_chunk_seconds + s.vocoder_first_chunk_in_vocoder_seconds < s.ttfa_seconds
    # the second audio chunk, which its listener waits for with the first one's audio only: sent before that ran out
    # (an idle stack), the llm's second chunk after its first, and the vocoder's time for it, its wait within it
    assert 0 < s.second_chunk_slack_seconds < sizes[0] / 24000
    assert s.llm_second_chunk_seconds > 0
    assert 0 <= s.vocoder_second_chunk_queue_seconds < s.vocoder_second_chunk_in_vocoder_seconds < s.total_seconds
    assert 0 < result.client_ttfa < result.client_total
    after = stage_counts(stack)
    for name in before:
        assert after[name] > before[name], f"{name} did not record the request"


def test_a_finished_turn_counts_ok_at_every_stage_not_cancelled(stack):
    """The gateway lets the vocoder end a finished stream itself; cancelling it would count CANCELLED there."""
    def codes():
        llm, voc = scrape(stack.ports.metrics["llm"]), scrape(stack.ports.metrics["vocoder"])
        return {(svc, code): metric_value(text, f"{svc}_requests_total", f'{{code="{code}"}}')
                for svc, text in (("llm", llm), ("vocoder", voc)) for code in ("OK", "CANCELLED")}

    async def turns(n: int):
        sampling = common_pb2.SamplingParams(max_new_tokens=6, seed=2)
        await asyncio.gather(*(synthesize(stack.target("gateway"), "Hi", sampling=sampling) for _ in range(n)))

    before = codes()
    asyncio.run(turns(8))
    deadline = time.monotonic() + 5
    while (after := codes())[("vocoder", "OK")] < before[("vocoder", "OK")] + 8 and time.monotonic() < deadline:
        time.sleep(0.05)  # a service counts its call when the call has ended, just after the client saw it end
    assert {k: after[k] - before[k] for k in before} == {("llm", "OK"): 8, ("llm", "CANCELLED"): 0,
                                                          ("vocoder", "OK"): 8, ("vocoder", "CANCELLED"): 0}


def test_float32_format(stack):
    sampling = common_pb2.SamplingParams(max_new_tokens=8, seed=1)
    result = asyncio.run(synthesize(stack.target("gateway"), "Hi", fmt=common_pb2.AUDIO_FORMAT_FLOAT32, sampling=sampling))
    assert result.format == common_pb2.AUDIO_FORMAT_FLOAT32
    assert sum(len(c) for c in result.chunks) == 4 * result.summary.num_samples == 4 * 8 * SAMPLES_PER_TOKEN
    assert np.isfinite(np.frombuffer(b"".join(result.chunks), "<f4")).all()
    voc = scrape(stack.ports.metrics["vocoder"])
    for stage in ("mel", "generator"):  # exported from the start, and none here
        assert re.search(rf'^vocoder_nonfinite_windows_total{{stage="{stage}"}} 0\.0$', voc, re.M), stage
    assert re.search(r"^vocoder_nonfinite_samples_total 0\.0$", voc, re.M)
    # every call of the main worker (no first-chunk lane here) in one class of vocoder_call_seconds_by_windows
    def by_windows(text: str) -> float:
        return sum(metric_value(text, "vocoder_call_seconds_by_windows_count", f'{{windows="{size}"}}')
                   for _, size in CALL_SIZES)
    deadline = time.monotonic() + 5  # (both are observed as a call ends, one just after the other)
    while by_windows(voc) != metric_value(voc, "vocoder_batch_seconds_count") and time.monotonic() < deadline:
        time.sleep(0.05)
        voc = scrape(stack.ports.metrics["vocoder"])
    assert by_windows(voc) == metric_value(voc, "vocoder_batch_seconds_count") > 0
    assert metric_value(voc, "vocoder_lane_batch_seconds_count") == 0


def test_client_cancel_releases_every_stage(stack):
    async def cancel_after_first_audio():
        async with grpc.aio.insecure_channel(stack.target("gateway")) as channel:
            call = gateway_pb2_grpc.GatewayStub(channel).Synthesize(
                gateway_pb2.SynthesizeRequest(text="Tell me a long story", sampling=common_pb2.SamplingParams(max_new_tokens=2000)))
            async for msg in call:
                if msg.WhichOneof("kind") == "audio":
                    call.cancel()
                    break

    asyncio.run(cancel_after_first_audio())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        llm, voc, gw = (scrape(stack.ports.metrics[s]) for s in ("llm", "vocoder", "gateway"))
        idle = (metric_value(llm, "llm_kv_blocks_used") == 0 and metric_value(llm, "llm_requests_running") == 0
                and metric_value(voc, "vocoder_active_streams") == 0 and metric_value(gw, "gateway_active_requests") == 0)
        if idle:
            break
        time.sleep(0.1)
    assert idle, "a cancelled turn left work running"


def test_moss_serve_say_writes_a_wav(stack, tmp_path):
    out = tmp_path / "out.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "say", "Good morning", "-o", str(out), "--target", stack.target("gateway"),
         "--max-new-tokens", "12", "--seed", "2"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "time to first audio" in proc.stdout and "llm prefill" in proc.stdout and "vocoder" in proc.stdout
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        assert w.getnframes() == 12 * SAMPLES_PER_TOKEN


@pytest.mark.parametrize("argv, says", [
    (["say", "hi", "-o", "{tmp}/missing/out.wav"], "cannot write {tmp}/missing/out.wav: no directory {tmp}/missing"),
    (["say", "hi", "-o", "{tmp}"], "cannot write {tmp}: a directory"),
    (["say", "--audio", "{tmp}/none.wav"], "cannot read {tmp}/none.wav: no such file"),
    (["say", "--audio", "{tmp}/text.wav"], "cannot read {tmp}/text.wav: Error opening"),
    (["bench", "--speech", "{tmp}/none.wav", "--concurrency", "1"], "cannot read {tmp}/none.wav: no such file"),
    (["chat", "--out-dir", "{tmp}/text.wav"], "cannot write in {tmp}/text.wav"),
    (["bench", "--out", "{tmp}/text.wav", "--concurrency", "1"], "cannot write in {tmp}/text.wav: File exists"),
])
def test_a_clients_own_mistake_is_one_line_before_any_call(tmp_path, argv, says):
    """Nothing listens at the target: a command that called it would say UNAVAILABLE, not what the user got wrong."""
    (tmp_path / "text.wav").write_text("not a sound file")
    argv = [a.format(tmp=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "services.cli", *argv, "--target", "127.0.0.1:1"], input="hi\n",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and says.format(tmp=tmp_path) in proc.stderr


def test_moss_serve_up_starts_and_stops_cleanly(tmp_path):
    ports = Ports.free(http=True)
    flags = ["--http-port", str(ports.http)]
    for service in ("gateway", "llm", "vocoder"):
        flags += [f"--{service}-port", str(ports.grpc[service]), f"--{service}-metrics-port", str(ports.metrics[service])]
    up = UpProcess(flags)
    try:
        up.wait_until(lambda: is_serving(f"127.0.0.1:{ports.grpc['gateway']}"))
        with urllib.request.urlopen(f"http://127.0.0.1:{ports.http}/healthz", timeout=5) as r:  # its HTTP door too
            assert r.status == 200
        assert up.stop() == 0
        assert "RANDOM weights" in up.said()
        assert not any(is_serving(f"127.0.0.1:{ports.grpc[s]}", timeout=0.5) for s in ("gateway", "llm", "vocoder"))
    finally:
        up.kill()


def test_a_request_sets_the_vocoders_lookahead(stack):
    """chunking.lookahead_frames travels gateway → vocoder: the tiny vocoder's whole right receptive field
    (8 frames) works; a value outside [0, 64] is refused with INVALID_ARGUMENT naming the field."""

    async def run(lookahead):
        request = gateway_pb2.SynthesizeRequest(text="Hello there", sampling=common_pb2.SamplingParams(max_new_tokens=10, seed=3),
                                                chunking=common_pb2.ChunkPolicy(lookahead_frames=lookahead))
        async with grpc.aio.insecure_channel(stack.target("gateway")) as channel:
            return [m async for m in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=60)]

    messages = asyncio.run(run(8))
    summary = messages[-1].summary
    assert summary.num_samples == summary.audio_tokens * SAMPLES_PER_TOKEN > 0
    for bad in (65, -1):
        try:
            asyncio.run(run(bad))
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "chunking.lookahead_frames" in err.details()
        else:
            raise AssertionError(f"lookahead_frames={bad} was accepted")


@pytest.mark.parametrize("field, value", [("lookahead_frames", 99), ("playback_speed", 5.0),
                                          ("playback_speed", float("nan"))])
def test_the_vocoder_refuses_a_bad_config_itself(stack, field, value):
    from moss.speech.v1 import vocoder_pb2, vocoder_pb2_grpc

    async def run():
        async with grpc.aio.insecure_channel(stack.target("vocoder")) as channel:
            call = vocoder_pb2_grpc.VocoderStub(channel).Vocode(timeout=30)
            await call.write(vocoder_pb2.VocodeRequest(config=vocoder_pb2.VocodeConfig(request_id="x", **{field: value})))
            await call.done_writing()
            return [m async for m in call]

    try:
        asyncio.run(run())
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and f"config.{field}" in err.details()
    else:
        raise AssertionError(f"{field}={value} was accepted")


def test_bad_vocoder_streams_fail_alone(stack):
    """Straight to the vocoder, all at once: a chunk after end, no config, an unknown code, an unknown sample
    format each end their own stream with INVALID_ARGUMENT naming the problem; the good streams running beside
    them (in the same batches) get all their audio."""
    from moss.speech.v1 import vocoder_pb2, vocoder_pb2_grpc

    V = vocoder_pb2.VocodeRequest
    config = V(config=vocoder_pb2.VocodeConfig(request_id="t"))
    chunk = V(tokens=vocoder_pb2.AudioTokens(tokens=[1, 2, 3]))
    end = V(end=vocoder_pb2.EndOfTokens())
    streams = {
        "good-1": [config, chunk, chunk, end],
        "good-2": [config, chunk, end],
        "after end": [config, chunk, end, chunk],
        "no config": [chunk],
        "unknown code": [config, chunk, V(tokens=vocoder_pb2.AudioTokens(tokens=[5, 10**6]))],
        "unknown format": [V(config=vocoder_pb2.VocodeConfig(request_id="f", format=7))],
    }

    async def run(messages):
        async with grpc.aio.insecure_channel(stack.target("vocoder")) as channel:
            call = vocoder_pb2_grpc.VocoderStub(channel).Vocode(timeout=30)
            for m in messages:
                await call.write(m)
            # A bad stream's last message is the offending one and its writer waits for the verdict with its side
            # open: writing (or half-closing) after the server has refused races the refusal, and gRPC's client
            # then reports its own failed write (INTERNAL) instead of the server's status.
            if messages[-1].WhichOneof("kind") == "end":
                await call.done_writing()
            try:
                return grpc.StatusCode.OK, [m async for m in call]
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details()

    async def all_streams():
        return dict(zip(streams, await asyncio.gather(*(run(m) for m in streams.values()))))

    results = asyncio.run(all_streams())
    for name, tokens in (("good-1", 6), ("good-2", 3)):
        code, messages = results[name]
        assert code == grpc.StatusCode.OK and messages[-1].final
        assert sum(m.num_samples for m in messages) == tokens * SAMPLES_PER_TOKEN
    for name, field in (("after end", "no message may follow end"), ("no config", "config"),
                        ("unknown code", "tokens.tokens"), ("unknown format", "config.format")):
        code, details = results[name]
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, (name, code, details)
