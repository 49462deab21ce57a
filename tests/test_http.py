"""The gateway's HTTP door: OpenAI's POST /v1/audio/speech, driven by the official `openai` package, in
every response format and both stream formats, decoded back; errors in OpenAI's shape with the right statuses;
the same API keys, admission and metrics as gRPC; nothing held after a client leaves or stops reading."""

from __future__ import annotations

import base64
import io
import json
import shutil
import socket
import subprocess
import sys
import time

import httpx2 as httpx  # the HTTP client the openai package itself uses
import numpy as np
import openai
import pytest
import soundfile
from conftest import left_held, metric_value, own_gateway, scrape, silent_speech_client

from services.gateway.time_stretch import TimeStretch
from services.stack import free_port

KEY = "alpha"
TOKENS = 24                 # every reply here: exactly this many audio tokens, from one seed
SAMPLES = TOKENS * 1920     # 80 ms of 24 kHz audio a token (the tiny codec)
FIXED = {"sampling": {"max_new_tokens": TOKENS, "min_new_tokens": TOKENS, "seed": 3}}
LONG = {"sampling": {"max_new_tokens": 2000, "min_new_tokens": 2000}}  # 160 s of audio: seconds to make on a CPU


@pytest.fixture(scope="module")
def gateway(stack, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(KEY + "\n")
    with own_gateway(stack, tmp_path_factory.mktemp("logs"), "--api-keys-file", str(keys),
                     "--client-stall-seconds", "1", http=True) as gw:
        yield gw


def base_url(gw) -> str:
    return f"http://127.0.0.1:{gw.http}"


def client(gw, key: str | None = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url(gw) + "/v1", api_key=key or "none", max_retries=0, timeout=60)


def speak(gw, fmt: str, **kw) -> openai._legacy_response.HttpxBinaryResponseContent:
    args = {"model": "moss-speech", "voice": "alloy", "input": "Hello there, how are you?", "response_format": fmt,
            "extra_body": FIXED, **kw}
    return client(gw).audio.speech.create(**args)


def decode(fmt: str, data: bytes, tmp_path) -> tuple[np.ndarray, int]:
    """→ (int16 samples, sample rate), through a decoder other than our encoder."""
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2"), 24000
    if fmt == "flac":  # libsndfile's reader fails on a streamed FLAC's unknown length; sox reads it
        if shutil.which("sox") is None:
            pytest.skip("sox is not installed (make tools installs it): no FLAC decoder to check with")
        path = tmp_path / "reply.flac"
        path.write_bytes(data)
        raw = subprocess.run(["sox", str(path), "-t", "raw", "-e", "signed", "-b", "16", "-"], capture_output=True,
                             check=True).stdout
        rate = int(subprocess.run(["soxi", "-r", str(path)], capture_output=True, text=True, check=True).stdout)
        return np.frombuffer(raw, dtype="<i2"), rate
    if fmt == "aac":  # FFmpeg's decoder (PyAV), reading the ADTS stream as a file would
        import av

        with av.open(io.BytesIO(data), format="adts") as f:
            rate = f.streams.audio[0].rate
            frames = [frame.to_ndarray().reshape(-1) for frame in f.decode(audio=0)]  # float planes, mono
        return (np.clip(np.concatenate(frames), -1, 1) * 32767).astype("<i2"), rate
    with soundfile.SoundFile(io.BytesIO(data)) as f:
        assert f.channels == 1
        return np.concatenate(list(f.blocks(4096, dtype="int16"))), f.samplerate


@pytest.fixture(scope="module")
def reference_pcm(gateway) -> np.ndarray:
    pcm = np.frombuffer(speak(gateway, "pcm").content, dtype="<i2")
    assert len(pcm) == SAMPLES
    return pcm


@pytest.mark.parametrize("fmt, content_type", [("pcm", "audio/pcm"), ("wav", "audio/wav"), ("flac", "audio/flac"),
                                               ("mp3", "audio/mpeg"), ("opus", "audio/ogg"), ("aac", "audio/aac")])
def test_every_format_decodes_to_the_turns_audio(gateway, reference_pcm, fmt, content_type, tmp_path):
    reply = speak(gateway, fmt)
    assert reply.response.headers["content-type"] == content_type
    samples, rate = decode(fmt, reply.content, tmp_path)
    assert rate == 24000
    if fmt in ("pcm", "wav", "flac"):  # lossless: the very samples of the same seeded turn
        assert np.array_equal(samples, reference_pcm)
    else:  # lossy: the codec's delay and padding (LAME: up to ~2 frames; Opus: its pre-skip is undone; AAC: 1,024
        # samples of priming and its last frame filled), and the sound
        assert SAMPLES - 960 <= len(samples) <= SAMPLES + 2 * 1152, len(samples)
        lag = int(np.argmax([np.dot(samples[d:d + SAMPLES // 2].astype(float), reference_pcm[:SAMPLES // 2])
                             for d in range(0, 1800)]))
        a, b = samples[lag:lag + SAMPLES // 2].astype(float), reference_pcm[:SAMPLES // 2].astype(float)
        assert np.corrcoef(a, b)[0, 1] > 0.5, "the decoded audio is not the turn's"


@pytest.mark.parametrize("speed, fmt", [(1.5, "pcm"), (0.75, "mp3")])
def test_speed_time_stretches_the_turns_audio(gateway, reference_pcm, speed, fmt, tmp_path):
    """OpenAI's `speed`: the turn's very samples, stretched (the same pitch) as time_stretch.py stretches them."""
    samples, rate = decode(fmt, speak(gateway, fmt, speed=speed).content, tmp_path)
    stretch = TimeStretch(speed, 24000)
    expected = np.frombuffer(stretch.feed(reference_pcm.tobytes()) + stretch.finish(), dtype="<i2")
    assert len(expected) == round(SAMPLES / speed)
    if fmt == "pcm":
        assert np.array_equal(samples, expected)
    else:  # LAME's delay and padding, as above
        assert len(expected) <= len(samples) <= len(expected) + 2 * 1152, len(samples)


def test_audio_streams_in_chunks_as_it_is_made(gateway):
    with client(gateway).audio.speech.with_streaming_response.create(
            model="tts-1", voice="default", input="Tell me a story.", response_format="pcm", extra_body=FIXED) as reply:
        chunks = [len(chunk) for chunk in reply.iter_bytes(chunk_size=None)]
    assert sum(chunks) == SAMPLES * 2 and len(chunks) > 1


def test_server_sent_events_carry_the_audio_then_the_usage(gateway, reference_pcm):
    body = {"model": "gpt-4o-mini-tts", "voice": "default", "input": "Hello there, how are you?",
            "response_format": "pcm", "stream_format": "sse", **FIXED}
    with httpx.stream("POST", base_url(gateway) + "/v1/audio/speech", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 1 and events[-1]["type"] == "speech.audio.done" and events[:-1] == deltas
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert np.array_equal(np.frombuffer(pcm, dtype="<i2"), reference_pcm)
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == TOKENS and usage["total_tokens"] == usage["input_tokens"] + TOKENS > TOKENS


@pytest.mark.parametrize("change, status, param, says", [
    ({"voice": "nobody"}, 400, "voice", "unknown voice 'nobody'; known voices: default"),
    ({"response_format": "ogg"}, 400, "response_format", "use one of pcm, wav, flac, mp3, opus, aac"),
    ({"speed": 9}, 400, "speed", "outside 0.25-4.0"),
    ({"model": "gpt-5"}, 404, "model", "not served here"),
    ({"input": "   "}, 400, "input", "must not be empty"),
    ({"input": "x" * 2001}, 400, "input", "over the limit of 2000"),
    ({"stream_format": "chunks"}, 400, "stream_format", "use one of audio, sse"),
    ({"instructions": "whisper"}, 400, "instructions", "not supported"),
    ({"extra_body": {"sampling": {"top_p": 7}}}, 400, "sampling.top_p", "must be in (0, 1]"),
    ({"extra_body": {"colour": "blue"}}, 400, "colour", "unknown field"),
])
def test_bad_requests_get_openai_errors_naming_the_field(gateway, change, status, param, says):
    args = {"model": "moss-speech", "voice": "alloy", "input": "hi", "response_format": "pcm", **change}
    with pytest.raises(openai.APIStatusError) as err:
        client(gateway).audio.speech.create(**args)
    assert err.value.status_code == status
    assert err.value.body["param"] == param and says in err.value.body["message"]
    assert err.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("method, path, body, status, says", [
    ("POST", "/v1/audio/speech", b"{not json", 400, "the body is not JSON"),
    ("POST", "/v1/audio/speech", b"[1, 2]", 400, "must be a JSON object"),
    ("POST", "/v1/audio/speech", b"[" * 100_000, 400, "the body is not JSON: maximum recursion depth"),
    ("POST", "/v1/audio/speech", b'{"model": "moss-speech", "voice": "alloy"}', 400, "input: required"),
    ("POST", "/v1/audio/speech", b'{"model": 7, "voice": "alloy", "input": "hi"}', 400, "must be a string"),
    ("POST", "/v1/audio/speech", b'{"model": "moss-speech", "voice": "alloy", "input": null}', 400, "input: required"),
    ("POST", "/v1/audio/speech", b'{"model": "moss-speech", "voice": "alloy", "input": "a\\ud800b"}', 400,
     "input: not Unicode: an unpaired surrogate at character 1"),
    ("POST", "/v1/audio/speech", b"x" * (2 << 20), 413, "over the limit of 1048576 bytes"),
    ("GET", "/v1/audio/speech", None, 405, "Method Not Allowed"),
    ("GET", "/v1/voices/nowhere", None, 404, "Not Found"),
])
def test_malformed_http_gets_a_clear_status(gateway, method, path, body, status, says):
    r = httpx.request(method, base_url(gateway) + path, content=body, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == status
    assert says in r.json()["error"]["message"]


def test_optional_fields_sent_as_null_take_their_defaults(gateway, reference_pcm):
    """Clients that send every field of OpenAI's schema send null for those not set: as if absent (mp3, speed 1)."""
    body = {"model": "moss-speech", "voice": "alloy", "input": "Hello there, how are you?", "response_format": None,
            "speed": None, "stream_format": None, "instructions": None, **FIXED}
    r = httpx.post(base_url(gateway) + "/v1/audio/speech", json=body, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    pcm, rate = decode("mp3", r.content, None)
    assert rate == 24000 and abs(len(pcm) - len(reference_pcm)) < 2 * 1152  # (an MP3 frame's samples of padding)
    body.update(sampling=None, response_format="pcm")
    r = httpx.post(base_url(gateway) + "/v1/audio/speech", json=body, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=60)
    assert r.status_code == 200 and len(r.content) > 0  # the turn's own sampling defaults


def test_the_api_keys_are_grpcs_and_the_probes_stay_open(gateway):
    with pytest.raises(openai.AuthenticationError) as err:
        client(gateway, key="wrong").audio.speech.create(model="moss-speech", voice="alloy", input="hi")
    assert "invalid API key" in err.value.body["message"]
    r = httpx.post(base_url(gateway) + "/v1/audio/speech", json={"model": "moss-speech", "voice": "alloy", "input": "x"})
    assert r.status_code == 401 and "missing" in r.json()["error"]["message"]
    assert [m.id for m in client(gateway).models.list()] == ["moss-speech"]
    assert httpx.get(base_url(gateway) + "/v1/models").status_code == 401
    assert httpx.get(base_url(gateway) + "/healthz").json() == {"status": "ok"}
    assert httpx.get(base_url(gateway) + "/readyz").status_code == 200


def test_http_turns_are_counted_under_their_protocol(gateway):
    before = scrape(gateway.metrics)
    speak(gateway, "wav")
    after = scrape(gateway.metrics)

    def grew(name, labels):
        return metric_value(after, name, labels) - metric_value(before, name, labels)

    assert grew("gateway_ttfa_seconds_count", '{protocol="http"}') == 1
    assert grew("gateway_audio_turns_total", '{protocol="http"}') == 1
    assert grew("gateway_ttfa_seconds_count", '{protocol="grpc"}') == 0
    # (the request is counted as its handler returns, which may come a moment after the client has read it all)
    wait_until(lambda: metric_value(scrape(gateway.metrics), "gateway_http_requests_total",
                                    '{route="/v1/audio/speech",status="200"}')
               - metric_value(before, "gateway_http_requests_total", '{route="/v1/audio/speech",status="200"}') == 1,
               5, "the request was not counted as a 200")


def test_a_client_that_leaves_mid_reply_frees_everything(gateway, stack):
    with client(gateway).audio.speech.with_streaming_response.create(
            model="moss-speech", voice="alloy", input="a long one", response_format="pcm", extra_body=LONG) as reply:
        for _ in reply.iter_bytes(chunk_size=4096):
            break  # one chunk, then gone
    wait_until(lambda: not any(left_held(gateway, stack).values()), 20, "a stage still holds the turn")


def test_a_client_that_stops_reading_is_ended_and_frees_everything(gateway, stack):
    """The gateway's writes wait for a client that never reads, and after --client-stall-seconds (1 here) the turn is
    ended in every stage."""
    stalled = '{method="speech"}'
    before = metric_value(scrape(gateway.metrics), "gateway_stalled_calls_total", stalled)
    with silent_speech_client(gateway.http, "never read", KEY):
        wait_until(lambda: metric_value(scrape(gateway.metrics), "gateway_stalled_calls_total", stalled) > before, 60,
                   "the silent HTTP client was not ended")
        wait_until(lambda: not any(left_held(gateway, stack).values()), 20, "a stage still holds the turn")


def test_refusals_carry_retry_after(stack, tmp_path):
    """One place, no queue: while a client holds it (not reading, for up to 10 s), another is refused 429 with
    Retry-After, as gRPC's RESOURCE_EXHAUSTED; once it leaves, the place is free again."""
    with own_gateway(stack, tmp_path, "--max-turns", "1", "--max-queued-turns", "0", "--max-turns-per-client", "0",
                     "--client-stall-seconds", "10",
                     "--api-keys-file", str(keys_file(tmp_path)), http=True) as gw:
        with silent_speech_client(gw.http, "holding the place", KEY):
            wait_until(lambda: metric_value(scrape(gw.metrics), "gateway_active_requests") == 1, 30, "never admitted")
            with pytest.raises(openai.RateLimitError) as err:
                client(gw).audio.speech.create(model="moss-speech", voice="alloy", input="second")
        assert int(err.value.response.headers["retry-after"]) >= 1
        assert err.value.body["code"] == "rate_limit_exceeded" and "gateway busy" in err.value.body["message"]
        wait_until(lambda: metric_value(scrape(gw.metrics), "gateway_active_requests") == 0, 20, "the place was kept")
        assert len(speak(gw, "pcm").content) == SAMPLES * 2


def keys_file(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text(KEY + "\n")
    return path


def test_a_stage_down_is_503_with_retry_after_and_not_ready(stack, tmp_path):
    """An llm that is not there: the gRPC health says NOT_SERVING, /readyz 503, and a request 503 with Retry-After
    once --ready-wait has passed; /healthz still says the gateway itself runs."""
    http = free_port()
    with open(tmp_path / "gateway.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "gateway", "--port", str(free_port()),
                                 "--metrics-port", "0", "--http-port", str(http), "--llm-target", f"127.0.0.1:{free_port()}",
                                 "--vocoder-target", stack.target("vocoder"), "--ready-wait", "0.5"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{http}"
        wait_until(lambda: up(url + "/healthz"), 30, "the gateway's HTTP door did not open")
        assert httpx.get(url + "/readyz").status_code == 503
        r = httpx.post(url + "/v1/audio/speech", timeout=30, json={"model": "moss-speech", "voice": "alloy", "input": "hi"})
        assert r.status_code == 503 and "llm" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["code"] == "service_unavailable" and int(r.headers["retry-after"]) >= 1
    finally:
        proc.terminate()
        proc.wait(10)


def up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_a_port_in_use_is_one_line_at_start(stack):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "services.cli", "gateway", "--port", str(free_port()),
                               "--metrics-port", "0", "--http-port", str(port), "--llm-target", stack.target("llm"),
                               "--vocoder-target", stack.target("vocoder")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and f"cannot bind HTTP 127.0.0.1:{port} (--http-port)" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_up_says_where_the_http_door_is():
    from services.cli import parser
    from services.up import http_url

    assert http_url(parser().parse_args(["up"])) == "http://127.0.0.1:8000"
    assert http_url(parser().parse_args(["up", "--host", "0.0.0.0", "--http-port", "8080"])) == "http://127.0.0.1:8080"
    assert http_url(parser().parse_args(["up", "--tls-dir", "/tls"])).startswith("https://")
