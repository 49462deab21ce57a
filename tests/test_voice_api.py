"""Voices made through the API (the gateway's voice book): a recording in through gRPC's CreateVoice or HTTP's
POST /v1/audio/voices, its codes from the encoder service and its mel and x-vector from each vocoder replica, kept in
each replica's voices directory; listed, used and deleted per API key; every refusal naming its field, with nothing
half-made left behind; the page's voice box in headless chromium. Real processes on the tiny presets (two vocoder
replicas, each with a voices directory of its own and a stand-in speaker model), two API keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import grpc
import numpy as np
import pytest
import soundfile as sf
import torch
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, vocoder_pb2, vocoder_pb2_grpc

from services.common.auth import bearer
from services.stack import Ports, Stack, free_port, is_serving
from services.vocoder.codec.config import tiny
from services.vocoder.codec.voice import load_voice, random_voice, save_voice
from tests.conftest import metric_value, replica_ready, scrape
from tests.speech import spoken

KEY_A, KEY_B = "key-of-alice", "key-of-bob"
PER_KEY = 2


@pytest.fixture(scope="module")
def recording():
    samples, rate = spoken("This is how I sound when I speak, slowly and clearly.")
    return (np.round(samples * 32768).clip(-32768, 32767) / 32768).astype(np.float32), rate  # (as PCM16 carries it)


@pytest.fixture(scope="module")
def voice_stack(tmp_path_factory):
    from services.voice_maker import stand_in_speaker_model as speaker_model

    root = tmp_path_factory.mktemp("voice-api")
    speaker_model(root / "speaker.onnx")
    dirs = [root / "voices-1", root / "voices-2"]
    for d in dirs:
        save_voice(random_voice(tiny().flow, "default", prompt_tokens=10, seed=1), d)
    extra = {"vocoder": ["--speaker-model", str(root / "speaker.onnx"), "--voices-dir", str(dirs[0]),
                        "--max-voices", "4"],
             "vocoder-2": ["--voices-dir", str(dirs[1])],
             "gateway": ["--voice-owners", str(root / "owners.json"), "--max-voices-per-key", str(PER_KEY)]}
    replicas = {"vocoder": 2}
    with Stack(Ports.free(replicas, http=True), extra_args=extra, replicas=replicas, log_dir=root / "logs",
               env={"gateway": {"MOSS_API_KEYS": f"{KEY_A},{KEY_B}"}}) as s:
        s.root, s.dirs = root, dirs
        # (the stack serves once each stage has a replica the gateway has seen ready; a voice needs both vocoders)
        deadline = time.monotonic() + 60
        while not all(replica_ready(s, v) for v in ("vocoder", "vocoder-2")):
            assert time.monotonic() < deadline, "the gateway never saw both vocoders ready"
            time.sleep(0.1)
        yield s


def stub(stack) -> gateway_pb2_grpc.GatewayStub:
    return gateway_pb2_grpc.GatewayStub(grpc.insecure_channel(stack.target("gateway")))


def create(stack, key: str | None, name: str, samples: np.ndarray, rate: int, fmt=common_pb2.AUDIO_FORMAT_PCM16,
           pcm: bytes | None = None) -> gateway_pb2.VoiceInfo:
    if pcm is None:
        pcm = ((samples * 32768).clip(-32768, 32767).astype("<i2").tobytes() if fmt == common_pb2.AUDIO_FORMAT_PCM16
               else samples.astype("<f4").tobytes())
    config = gateway_pb2.CreateVoiceRequest(config=gateway_pb2.VoiceConfig(name=name, sample_rate=rate, format=fmt))
    pieces = [gateway_pb2.CreateVoiceRequest(audio=pcm[i : i + 32000]) for i in range(0, len(pcm), 32000)]
    return stub(stack).CreateVoice(iter([config, *pieces]), metadata=bearer(key), timeout=120)


def listed(stack, key: str | None) -> dict[str, bool]:
    return {v.name: v.own for v in stub(stack).ListVoices(gateway_pb2.VoiceListRequest(), metadata=bearer(key),
                                                          timeout=10).voices}


def speak(stack, key: str | None, voice: str) -> int:
    """→ audio samples of a short reply in `voice`."""
    request = gateway_pb2.SynthesizeRequest(text="Hello there.", voice=voice,
                                            sampling=common_pb2.SamplingParams(max_new_tokens=8, seed=1))
    return sum(m.audio.num_samples for m in stub(stack).Synthesize(request, metadata=bearer(key), timeout=120)
               if m.HasField("audio"))


def refused(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def files(stack) -> list[list[str]]:
    return [sorted(p.name for p in d.iterdir()) for d in stack.dirs]


def test_a_voice_made_over_grpc_is_the_clis_is_its_keys_alone_and_is_deleted_everywhere(voice_stack, recording,
                                                                                       tmp_path):
    """CreateVoice → both replicas keep the voice `moss-serve voice` makes of the same recording (codes, mel and
    x-vector exactly); the key that made it lists and uses it, the other key neither sees nor names it, nor deletes
    it; deleted, it is gone from both replicas and their directories."""
    stack, (samples, rate) = voice_stack, recording
    info = create(stack, KEY_A, "alice", samples, rate)
    assert info.name == "alice" and info.own and info.kept and info.fast, info
    assert info.prompt_seconds == pytest.approx(len(samples) / rate, abs=0.1)
    assert files(stack) == [["alice.safetensors", "default.safetensors"]] * 2  # (nothing half-made beside)
    sf.write(tmp_path / "me.wav", samples, rate, subtype="PCM_16")
    done = subprocess.run([sys.executable, "-m", "services.cli", "voice", str(tmp_path / "me.wav"), "--name", "alice",
                           "--voices-dir", str(tmp_path), "--speaker-model", str(stack.root / "speaker.onnx"),
                           "--preset", "tiny"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    want = load_voice(tmp_path / "alice.safetensors", tiny().flow)
    for d in stack.dirs:
        got = load_voice(d / "alice.safetensors", tiny().flow)
        assert torch.equal(got.prompt_tokens, want.prompt_tokens)
        torch.testing.assert_close(got.prompt_mel, want.prompt_mel, atol=0, rtol=0)
        torch.testing.assert_close(got.embedding, want.embedding, atol=0, rtol=0)

    assert metric_value(scrape(stack.ports.metrics["gateway"]), "gateway_voice_create_seconds_count") == 1
    assert [metric_value(scrape(stack.ports.metrics[v]), "vocoder_voices") for v in ("vocoder", "vocoder-2")] == [2, 2]
    assert all(metric_value(scrape(stack.ports.metrics[v]), "vocoder_voice_add_seconds_count") == 1
               for v in ("vocoder", "vocoder-2"))
    assert listed(stack, KEY_A) == {"alice": True, "default": False}
    assert listed(stack, KEY_B) == {"default": False}
    assert speak(stack, KEY_A, "alice") > 0
    code, details = refused(lambda: speak(stack, KEY_B, "alice"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details == "voice: unknown voice 'alice'; known voices: default"
    code, _ = refused(lambda: stub(stack).DeleteVoice(gateway_pb2.DeleteVoiceRequest(name="alice"),
                                                      metadata=bearer(KEY_B), timeout=30))
    assert code == grpc.StatusCode.NOT_FOUND
    owners = json.loads((stack.root / "owners.json").read_text())["voices"]
    assert list(owners) == ["alice"] and KEY_A not in owners["alice"]  # (a digest: the key is not kept)
    stub(stack).DeleteVoice(gateway_pb2.DeleteVoiceRequest(name="alice"), metadata=bearer(KEY_A), timeout=30)
    assert listed(stack, KEY_A) == {"default": False}
    assert metric_value(scrape(stack.ports.metrics["gateway"]), "gateway_voices_deleted_total") == 1
    assert metric_value(scrape(stack.ports.metrics["vocoder"]), "vocoder_voices") == 1
    assert files(stack) == [["default.safetensors"]] * 2
    code, details = refused(lambda: stub(stack).DeleteVoice(gateway_pb2.DeleteVoiceRequest(name="default"),
                                                            metadata=bearer(KEY_A), timeout=30))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "vocoders' own" in details


def test_a_recording_longer_than_a_prompt_is_cut_at_a_pause_as_the_cli_cuts_it(voice_stack, recording, tmp_path):
    """A recording over the vocoders' max_prompt_seconds (7.04 s) makes a voice of its first seconds, cut at a
    pause: the voice `moss-serve voice --prompt-seconds 7.04` makes of it, exactly."""
    stack, (samples, rate) = voice_stack, recording
    long = np.tile(samples, 3)
    assert len(long) / rate > 7.04
    info = create(stack, KEY_A, "long", long, rate)
    assert info.fast and 5.0 <= info.prompt_seconds <= 7.04, info
    sf.write(tmp_path / "long.wav", long, rate, subtype="PCM_16")
    done = subprocess.run([sys.executable, "-m", "services.cli", "voice", str(tmp_path / "long.wav"), "--name", "long",
                           "--voices-dir", str(tmp_path), "--speaker-model", str(stack.root / "speaker.onnx"),
                           "--preset", "tiny", "--prompt-seconds", "7.04"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    want = load_voice(tmp_path / "long.safetensors", tiny().flow)
    got = load_voice(stack.dirs[0] / "long.safetensors", tiny().flow)
    assert len(got.prompt_tokens) * 0.08 == pytest.approx(info.prompt_seconds)
    assert torch.equal(got.prompt_tokens, want.prompt_tokens) and torch.equal(got.prompt_mel, want.prompt_mel)
    assert torch.equal(got.embedding, want.embedding)
    stub(stack).DeleteVoice(gateway_pb2.DeleteVoiceRequest(name="long"), metadata=bearer(KEY_A), timeout=30)
    assert files(stack) == [["default.safetensors"]] * 2


def test_every_bad_recording_or_name_is_refused_naming_it_and_nothing_is_left(voice_stack, recording):
    stack, (samples, rate) = voice_stack, recording
    t = np.arange(int(4 * rate)) / rate
    hum = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    cases = [
        (dict(name="../x"), grpc.StatusCode.INVALID_ARGUMENT, "name: '../x' is not a name a voice may take"),
        (dict(name="default"), grpc.StatusCode.INVALID_ARGUMENT, "name: 'default' is not a name"),
        (dict(samples=np.zeros(4 * rate, np.float32)), grpc.StatusCode.INVALID_ARGUMENT, "audio: the recording is silence"),
        (dict(samples=samples[: 2 * rate]), grpc.StatusCode.INVALID_ARGUMENT, "too short, give at least 3 s"),
        (dict(samples=np.tile(samples, 10)), grpc.StatusCode.INVALID_ARGUMENT, "audio: the recording is over 30 s"),
        (dict(samples=np.clip(hum * 10, -1, 1)), grpc.StatusCode.INVALID_ARGUMENT, "the recording is clipped"),
        (dict(rate=4000), grpc.StatusCode.INVALID_ARGUMENT, "config.sample_rate: the recording's rate is 4000 Hz"),
        (dict(pcm=b"\x00" * 7), grpc.StatusCode.INVALID_ARGUMENT, "audio: 7 bytes are not whole samples"),
        (dict(fmt=common_pb2.AUDIO_FORMAT_FLOAT32, pcm=np.full(4 * rate, np.nan, "<f4").tobytes()),
         grpc.StatusCode.INVALID_ARGUMENT, "audio: sample 0 is not a finite number"),
    ]
    for override, code, message in cases:
        args = dict(name="x", samples=samples, rate=rate) | override
        got, details = refused(lambda: create(stack, KEY_A, args["name"], args["samples"], args["rate"],
                                              override.get("fmt", common_pb2.AUDIO_FORMAT_PCM16), override.get("pcm")))
        assert got == code and message in details, (override.keys(), details)
    assert listed(stack, KEY_A) == {"default": False}
    assert files(stack) == [["default.safetensors"]] * 2

    assert create(stack, KEY_A, "a1", samples, rate, common_pb2.AUDIO_FORMAT_FLOAT32).own  # (float32 in: the same)
    code, details = refused(lambda: create(stack, KEY_B, "a1", samples, rate))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "exists already" in details
    create(stack, KEY_A, "a2", samples, rate)
    code, details = refused(lambda: create(stack, KEY_A, "a3", samples, rate))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and f"its most voices, {PER_KEY} (--max-voices-per-key)" in details
    create(stack, KEY_B, "b1", samples, rate)                    # (another key's own count)
    code, details = refused(lambda: create(stack, KEY_B, "b2", samples, rate))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "the vocoder holds its most voices, 4 (--max-voices)" in details
    for key, name in ((KEY_A, "a1"), (KEY_A, "a2"), (KEY_B, "b1")):
        stub(stack).DeleteVoice(gateway_pb2.DeleteVoiceRequest(name=name), metadata=bearer(key), timeout=30)
    assert files(stack) == [["default.safetensors"]] * 2


def test_over_http_with_the_openai_package_and_a_replica_that_restarts_keeps_the_voice(voice_stack, recording, tmp_path):
    """POST /v1/audio/voices (multipart: file, name) makes the voice; the openai package speaks in it for its key
    and is refused for the other; a vocoder replica killed and started again has it from its directory; DELETE
    removes it."""
    import openai

    stack, (samples, rate) = voice_stack, recording
    base = f"http://127.0.0.1:{stack.ports.http}/v1"
    sf.write(tmp_path / "bob.flac", samples, rate)
    made = post_voice(base, KEY_B, "bob", (tmp_path / "bob.flac").read_bytes())
    assert made[0] == 201 and made[1]["name"] == "bob" and made[1]["own"] and made[1]["kept"], made
    for body, why in [(b"not a sound file", "cannot read the file"), (None, "file: missing")]:
        status, error = post_voice(base, KEY_B, "bob2", body)
        assert status == 400 and why in error["error"]["message"] and error["error"]["param"] == "file", error
    status, error = post_voice(base, KEY_B, "bob", (tmp_path / "bob.flac").read_bytes())
    assert status == 409, error
    status, error = post_voice(base, KEY_B, "bob3", (tmp_path / "bob.flac").read_bytes(), origin="https://evil.example")
    assert status == 403 and "--allowed-origins" in error["error"]["message"], error

    bob = openai.OpenAI(base_url=base, api_key=KEY_B, max_retries=0)
    alice = openai.OpenAI(base_url=base, api_key=KEY_A, max_retries=0)
    assert len(bob.audio.speech.create(model="moss-speech", voice="bob", input="Hi.", response_format="pcm").content) > 0
    with pytest.raises(openai.BadRequestError, match="unknown voice 'bob'"):
        alice.audio.speech.create(model="moss-speech", voice="bob", input="Hi.", response_format="pcm")
    assert get_json(f"{base}/audio/voices", KEY_B)["voices"] == ["bob", "default"]
    assert get_json(f"{base}/audio/voices", KEY_A)["voices"] == ["default"]

    proc = stack.procs["vocoder-2"]                               # a replica killed and started again
    proc.kill()
    proc.wait(10)
    stack.start("vocoder-2")
    stack.wait_serving(["vocoder-2"], timeout=120)
    with grpc.insecure_channel(stack.target("vocoder-2")) as channel:  # it read the voice from its directory
        listed_there = vocoder_pb2_grpc.VocoderStub(channel).ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=10)
    assert list(listed_there.voices) == ["bob", "default"]
    deadline = time.monotonic() + 60  # turns in the voice, until one has played on the replica started again
    while metric_value(scrape(stack.ports.metrics["vocoder-2"]), "vocoder_requests_total", '{code="OK"}') < 1:
        assert speak(stack, KEY_B, "bob") > 0  # (one placed on it while it was down goes to the other)
        assert time.monotonic() < deadline, "no turn went to the replica started again"

    request = urllib.request.Request(f"{base}/audio/voices/bob", method="DELETE", headers=auth(KEY_A))
    assert http_status(request) == 404
    request = urllib.request.Request(f"{base}/audio/voices/bob", method="DELETE", headers=auth(KEY_B))
    assert http_status(request) == 200
    assert files(stack) == [["default.safetensors"]] * 2


def test_a_replica_that_refuses_the_voice_leaves_it_on_none(voice_stack, stack, recording, tmp_path):
    """A gateway over two vocoders, one of which cannot make voices (no --speaker-model): the one that took the voice
    removes it again, and the call says why."""
    samples, rate = recording
    port = free_port()
    with open(tmp_path / "gateway.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "gateway", "--port", str(port), "--metrics-port",
                                 str(free_port()), "--http-port", "0",  # (the default port: another test's may hold it)
                                 "--llm-target", voice_stack.target("llm"), "--vocoder-target",
                                 f"{voice_stack.target('vocoder')},{stack.target('vocoder')}", "--encoder-target",
                                 voice_stack.target("encoder")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not is_serving(f"127.0.0.1:{port}"):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        other = type("Gateway", (), {"target": lambda self, name: f"127.0.0.1:{port}"})()
        name = f"v{uuid.uuid4().hex[:6]}"
        deadline = time.monotonic() + 10
        while True:  # (until the gateway has asked both vocoders for their voices)
            code, details = refused(lambda: create(other, None, name, samples, rate))
            if code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "--speaker-model" in details, details
    finally:
        proc.terminate()
        proc.wait(10)
    assert files(voice_stack)[0] == ["default.safetensors"]
    assert listed(voice_stack, KEY_A) == {"default": False}


def test_two_gateways_over_the_same_vocoders_share_who_owns_each_voice(voice_stack, recording, tmp_path):
    """A second gateway with the same --voice-owners file: a voice the first made for key A is A's through the second
    too (B neither sees nor names it), and A deletes it there; the second learns of the voice from the vocoders."""
    stack, (samples, rate) = voice_stack, recording
    port = free_port()
    env = {**os.environ, "MOSS_API_KEYS": f"{KEY_A},{KEY_B}"}
    with open(tmp_path / "gateway-2.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "gateway", "--port", str(port), "--metrics-port",
                                 str(free_port()), "--http-port", "0", "--llm-target", stack.target("llm"), "--vocoder-target",
                                 f"{stack.target('vocoder')},{stack.target('vocoder-2')}", "--encoder-target",
                                 stack.target("encoder"), "--voice-owners", str(stack.root / "owners.json")],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    second = type("Gateway", (), {"target": lambda self, name: f"127.0.0.1:{port}"})()
    try:
        deadline = time.monotonic() + 60
        while not is_serving(f"127.0.0.1:{port}"):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        create(stack, KEY_A, "shared-file", samples, rate)              # through the first gateway
        deadline = time.monotonic() + 30
        while "shared-file" not in listed(second, KEY_A):              # (the second asks the vocoders every 5 s)
            assert time.monotonic() < deadline, "the second gateway never learned of the voice"
            time.sleep(0.5)
        assert listed(second, KEY_A) == {"default": False, "shared-file": True}
        assert listed(second, KEY_B) == {"default": False}
        code, _ = refused(lambda: speak(second, KEY_B, "shared-file"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert speak(second, KEY_A, "shared-file") > 0
        stub(second).DeleteVoice(gateway_pb2.DeleteVoiceRequest(name="shared-file"), metadata=bearer(KEY_A), timeout=30)
        assert json.loads((stack.root / "owners.json").read_text())["voices"] == {}
    finally:
        proc.terminate()
        proc.wait(10)
    assert files(stack) == [["default.safetensors"]] * 2


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def http_status(request) -> int:
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def get_json(url: str, key: str) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, headers=auth(key)), timeout=10) as r:
        return json.loads(r.read())


def post_voice(base: str, key: str, name: str, data: bytes | None, origin: str | None = None) -> tuple[int, dict]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'.encode()]
    if data is not None:
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="me.flac"\r\n'
                     f"Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    headers = {**auth(key), "Content-Type": f"multipart/form-data; boundary={boundary}"}
    if origin:
        headers["Origin"] = origin
    request = urllib.request.Request(f"{base}/audio/voices", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_pages_voice_box_records_a_voice_and_the_session_speaks_in_it(voice_stack, recording, tmp_path_factory,
                                                                         tmp_path):
    """The page in headless chromium, its microphone espeak-ng's sentence: Record, Stop, a name, Make voice → the
    voice is made (both replicas keep it), the voice picker has it chosen, and a typed turn is answered in it."""
    import asyncio

    from test_web_page import CHROMIUM, launched_chromium, open_page, screenshot_dir

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make tools installs it as root)")
    samples, rate = recording
    microphone = tmp_path / "speaker.wav"
    sf.write(microphone, samples, rate, subtype="PCM_16")
    seconds = len(samples) / rate

    async def scenario(port: int):
        page = await open_page(port, f"http://127.0.0.1:{voice_stack.ports.http}/")
        try:
            await page.type("#key", KEY_A)
            await page.type("#max-tokens", "12")
            await page.type("#voice-name", "from-the-page")
            await page.js("document.getElementById('voice-record').click()")
            await page.until("mossPage.recordingVoice", 30, "the microphone did not open")
            await asyncio.sleep(seconds + 0.3)  # the sentence, said in real time
            await page.js("document.getElementById('voice-make').click()")  # (it stops the recording first)
            made = await page.until("mossPage.voicesMade[0] || (mossPage.errors.length && mossPage.errors)", 120,
                                    "the voice was never made")
            assert isinstance(made, dict) and made["name"] == "from-the-page" and made["own"] and made["kept"], made
            assert 3.0 <= await page.js("mossPage.voiceSeconds") <= 7.0
            await page.until("document.getElementById('voice').value === 'from-the-page'", 10, "the voice is not chosen")
            await page.js("document.getElementById('send').click()")
            turn = await page.until("(() => { const t = mossPage.turns[0]; return t && t.summary && t; })()", 60,
                                    "the turn in the new voice was never answered")
            assert turn["samples"] > 0 and not await page.js("mossPage.errors.length"), await page.js("mossPage.errors")
            print(f"\nscreenshot: {await page.screenshot(screenshot_dir(tmp_path) / 'web_page_voice.png')}")
        finally:
            await page.close()

    with launched_chromium(tmp_path_factory, microphone) as port:
        asyncio.run(scenario(port))
    assert all("from-the-page.safetensors" in names for names in files(voice_stack))
    stub(voice_stack).DeleteVoice(gateway_pb2.DeleteVoiceRequest(name="from-the-page"), metadata=bearer(KEY_A),
                                  timeout=30)
    assert files(voice_stack) == [["default.safetensors"]] * 2
