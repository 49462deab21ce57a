"""Voices added to a serving vocoder (codec/prefix.py's places, decoder.add_voice, TokenVocoder.add_voice): a voice
added later speaks as one given at the start, its streams on the fast path (the prompt prefix and a stream history);
a stream already playing in another voice is left as it was; a voice that cannot take a place (none free, or a prompt
shorter than the prefix) is decoded whole over its window, as it would be without the places; bad voices are refused.
The tiny codec on a CPU, float32."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from moss.speech.v1 import vocoder_pb2, vocoder_pb2_grpc

from services.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from services.stack import free_port, is_serving
from services.vocoder.codec.config import tiny
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.flow_state import FlowState
from services.vocoder.codec.voice import Voice, random_voice, save_voice
from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.streamer import MelStreamer

CPU = torch.device("cpu")


def codes(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


def test_a_voice_added_later_reads_its_prefix_as_one_given_at_the_start(flow, voices):
    """Streams of both voices in one call: the decoder that was given the second voice later computes the same mel."""
    at_start = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    at_start.set_voices(voices)
    later = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    later.set_voices(voices[:1], capacity=len(voices))
    assert later.prefix.frames == at_start.prefix.frames and not later.prefix.covers(voices[1:])
    assert later.add_voice(voices[1]) and later.prefix.covers(voices)
    assert later.add_voice(voices[1])                                  # (twice: the same place)
    streams = [FlowState(v, tuple(codes(23, seed=i)), 0, 15) for i, v in enumerate(voices)]
    want = at_start.decode_chunks([([], s) for s in streams])
    got = later.decode_chunks([([], s) for s in streams])
    for (w, _), (g, _) in zip(want, got):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


def test_without_a_place_or_with_a_short_prompt_a_voice_is_solved_whole(flow, voices):
    full = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    full.set_voices(voices[:1])                                         # one place, taken
    assert not full.add_voice(voices[1]) and not full.prefix.covers(voices[1:])
    long_first = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    long_first.set_voices(voices[1:], capacity=3)                       # a prefix of 40 frames
    assert not long_first.add_voice(voices[0])                          # 10 tokens reach 20 of them
    whole = FlowTokenDecoder(flow, CPU)                                 # no prefix at all
    stream = FlowState(voices[0], tuple(codes(23, seed=5)), 0, 15)
    (want, _), = whole.decode_chunks([([], stream)])
    (got, _), = long_first.decode_chunks([([], stream)])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_a_removed_voices_place_is_a_new_voices_once_its_last_stream_ends(flow, voices):
    """While a stream of the removed voice plays, its place is kept (a voice added then is solved whole); once the
    stream ends, the next voice takes the place and speaks as one given at the start."""
    cfg = tiny().flow
    later = [random_voice(cfg, name, prompt_tokens=10, seed=seed) for name, seed in (("c", 7), ("d", 8))]
    live = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    live.set_voices(voices[:1], capacity=2)
    assert live.add_voice(voices[1])                                    # the second place
    playing = live.start(voices[1])
    live.remove_voice(voices[1])
    assert not live.add_voice(later[0])                                 # its stream plays on: no place
    live.release(playing)
    assert live.add_voice(later[1]) and live.prefix.covers([voices[0], later[1]])
    assert not live.prefix.covers([voices[1]])
    at_start = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    at_start.set_voices([voices[0], later[1]])
    stream = FlowState(later[1], tuple(codes(23, seed=9)), 0, 15)
    (want, _), = at_start.decode_chunks([([], stream)])
    (got, _), = live.decode_chunks([([], stream)])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def voices_dir(tmp_path, *voices: Voice):
    d = tmp_path / "_".join(v.name for v in voices)
    for v in voices:
        save_voice(v, d)
    return d


def play(vocoder, voice: str, tokens: list[int], schedule: list[int], between=lambda i: None) -> np.ndarray:
    s = MelStreamer(vocoder, voice=voice)
    pieces, at = [], 0
    for i, n in enumerate(schedule):
        pieces.append(s.push(tokens[at : at + n]))
        at += n
        between(i)
    pieces.append(s.flush())
    s.close()
    return np.concatenate(pieces)


def test_a_voice_added_while_a_stream_plays_leaves_it_as_it_was_and_speaks_as_one_given_at_the_start(tmp_path):
    """The vocoder as served: a stream in voice `a` takes a history slot and plays; `b` is added between its chunks;
    `a`'s samples are those of a vocoder that never added a voice, and `b`'s stream, on the fast path (its history
    slot taken), those of a vocoder given `b` at the start."""
    cfg = tiny().flow
    a, b = random_voice(cfg, "a", prompt_tokens=10, seed=1), random_voice(cfg, "b", prompt_tokens=12, seed=2)
    live = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a))
    alone = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a))
    both = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a, b))
    tokens, schedule = codes(40, seed=7), [8, 12, 20]
    added = []

    def add_b(i):
        if i == 0:
            assert live.decoder.history.held == 1                      # `a` plays from its history slot
            added.append(live.add_voice(b)[0])

    got_a = play(live, "a", tokens, schedule, add_b)
    assert added == [True] and "b" in live.voice_names()
    # (to 1e-6: a voice's prefix or first-call lefts left unwritten moves these samples by ~5e-5 of ~0.09)
    np.testing.assert_allclose(got_a, play(alone, "a", tokens, schedule), atol=1e-6)
    slots = []
    got_b = play(live, "b", tokens, schedule, lambda i: slots.append(live.decoder.history.held))
    assert max(slots) == 1                                             # `b` on the fast path too (a slot once it
                                                                       # has a first block: 8 tokens and 3 ahead)
    np.testing.assert_allclose(got_b, play(both, "b", tokens, schedule), atol=1e-6)
    assert live.decoder.history.held == 0


def test_bad_voices_are_refused_and_the_places_are_sized_by_max_voices(tmp_path):
    cfg = tiny().flow
    a = random_voice(cfg, "a", prompt_tokens=10, seed=1)
    live = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a), flow=FlowOptions(max_voices=2))
    assert live.decoder.prefix.capacity == 2
    with pytest.raises(AlreadyExists, match="exists"):
        live.add_voice(random_voice(cfg, "a", prompt_tokens=10, seed=3))
    bad = Voice("c", torch.tensor([1, 2, 3]), torch.zeros(5, cfg.output_size), torch.zeros(cfg.spk_embed_dim))
    with pytest.raises(InvalidArgument, match="prompt_mel"):
        live.add_voice(bad)
    with pytest.raises(InvalidArgument, match=r"prompt_tokens: 89 codes; a voice's prompt is at most 88 codes \(7.04 s"):
        live.add_voice(random_voice(cfg, "long", prompt_tokens=89, seed=3))
    for name in ("../x", "", ".hidden", "x" * 65):
        with pytest.raises(InvalidArgument, match="name"):
            live.add_voice(random_voice(cfg, name, prompt_tokens=10, seed=3))
    assert live.voice_names() == ["a"]
    assert live.add_voice(random_voice(cfg, "b", prompt_tokens=10, seed=4)) == (True, True)
    with pytest.raises(ResourceExhausted, match=r"most voices, 2 \(--max-voices\)"):
        live.add_voice(random_voice(cfg, "c", prompt_tokens=10, seed=5))
    live.remove_voice("b")                                              # (no stream of b plays: its place is free)
    assert live.add_voice(random_voice(cfg, "c", prompt_tokens=10, seed=5)) == (True, True)
    assert live.voice_names() == ["a", "c"]
    kept = sorted(p.name for p in live.voices_dir.iterdir())
    assert kept == ["a.safetensors", "c.safetensors"]                   # (nothing half-made beside them)
    again = load_vocoder(None, "tiny-codec", voices_dir=live.voices_dir)  # a restart has them again
    assert again.voice_names() == ["a", "c"]
    one = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path / "fresh", a))
    assert one.decoder.prefix.capacity == 5                             # by default: the directory's and 4 more
    with pytest.raises(FailedPrecondition, match="no voice"):
        load_vocoder(None, "tiny").add_voice(a)
    memory_only = load_vocoder(None, "tiny-codec")                      # no voices directory: kept in memory only
    assert memory_only.add_voice(random_voice(cfg, "b", prompt_tokens=10, seed=4)) == (True, False)


def vocoder_process(voices: Path, port: int, log: Path, *flags: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "vocoder", "--port", str(port), "--metrics-port",
                             str(free_port()), "--preset", "tiny-codec", "--voices-dir", str(voices), *flags],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not is_serving(f"127.0.0.1:{port}"):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    return proc


def add_request(voice: Voice, **override) -> vocoder_pb2.AddVoiceRequest:
    fields = dict(name=voice.name, prompt_tokens=voice.prompt_tokens.tolist(),
                  prompt_mel=voice.prompt_mel.numpy().astype("<f4").tobytes(), embedding=voice.embedding.tolist())
    return vocoder_pb2.AddVoiceRequest(**{**fields, **override})


def test_add_voice_through_the_vocoders_grpc_speaks_at_once_refuses_what_it_must_and_outlives_a_restart(tmp_path):
    """AddVoice on a running vocoder (a real process): the voice is listed and a stream speaks in it at once; a taken
    name, a bad name and a mel that is not rows of 80 are refused naming what; the vocoder restarted has the voice."""
    cfg = tiny().flow
    a, b = random_voice(cfg, "a", prompt_tokens=10, seed=1), random_voice(cfg, "b", prompt_tokens=12, seed=2)
    voices, port, log = voices_dir(tmp_path, a), free_port(), tmp_path / "vocoder.log"
    proc = vocoder_process(voices, port, log)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = vocoder_pb2_grpc.VocoderStub(channel)
            reply = stub.AddVoice(add_request(b), timeout=60)
            assert reply.fast and reply.kept
            assert list(stub.ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=10).voices) == ["a", "b"]
            requests = [vocoder_pb2.VocodeRequest(config=vocoder_pb2.VocodeConfig(voice="b")),
                        vocoder_pb2.VocodeRequest(tokens=vocoder_pb2.AudioTokens(tokens=codes(20, seed=3))),
                        vocoder_pb2.VocodeRequest(end=vocoder_pb2.EndOfTokens())]
            chunks = list(stub.Vocode(iter(requests), timeout=60))
            assert chunks[-1].final and sum(c.num_samples for c in chunks) > 0
            for request, code, what in [
                (add_request(b), grpc.StatusCode.ALREADY_EXISTS, "voice 'b' exists already"),
                (add_request(b, name="../etc"), grpc.StatusCode.INVALID_ARGUMENT, "name: '../etc' is not a voice name"),
                (add_request(b, name="c", prompt_mel=b"\x00" * 7), grpc.StatusCode.INVALID_ARGUMENT,
                 "prompt_mel: 7 bytes are not rows of 80 float32"),
                (add_request(b, name="c", embedding=[0.0] * 3), grpc.StatusCode.INVALID_ARGUMENT, "embedding must be"),
            ]:
                with pytest.raises(grpc.RpcError) as err:
                    stub.AddVoice(request, timeout=30)
                assert err.value.code() == code and what in err.value.details(), err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                stub.RemoveVoice(vocoder_pb2.RemoveVoiceRequest(name="nope"), timeout=10)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND and "name: no voice 'nope'" in err.value.details()
        assert sorted(p.name for p in voices.iterdir()) == ["a.safetensors", "b.safetensors"]
        proc.terminate()
        proc.wait(30)
        proc = vocoder_process(voices, port, log)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            listed = vocoder_pb2_grpc.VocoderStub(channel).ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=10)
        assert list(listed.voices) == ["a", "b"]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_voice_made_from_a_recording_by_the_vocoder_is_the_one_moss_serve_voice_makes(tmp_path):
    """AddVoice with the recording and its codes: the vocoder makes the mel and the x-vector with --speaker-model as
    `moss-serve voice` does (services/voice_maker.py, one implementation): the file it keeps equals the command's
    voice for the same recording, exactly; without --speaker-model it is refused saying so; a recording that is not
    PCM, silence, under 3 s, over what the graphs take (7.04 s) or clipped is refused naming it, and nothing is
    left of it."""
    from services.encoder.checkpoint import random_tokenizer
    from services.encoder.config import tiny as tiny_encoder
    from services.vocoder.codec.voice import load_voice
    from services.voice_maker import make_voice
    from services.voice_maker import stand_in_speaker_model as speaker_model

    cfg = tiny().flow
    speaker_model(tmp_path / "speaker.onnx")
    rate = 22_050
    def hum(seconds: float, level: float = 0.3) -> np.ndarray:
        t = np.arange(int(seconds * rate)) / rate
        return (level * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)

    def pcm16(x: np.ndarray) -> bytes:
        return (np.clip(x, -1, 32767 / 32768) * 32768).astype("<i2").tobytes()

    samples = hum(3.5)
    samples = (np.round(samples * 32768).clip(-32768, 32767) / 32768).astype(np.float32)  # (as its PCM16 carries it)
    want = make_voice("hum", samples, rate, random_tokenizer(tiny_encoder()), tmp_path / "speaker.onnx", cfg)
    pcm = (samples * 32768).astype("<i2").tobytes()
    voices, port, log = voices_dir(tmp_path, random_voice(cfg, "a", prompt_tokens=10, seed=1)), free_port(), \
        tmp_path / "vocoder.log"
    request = vocoder_pb2.AddVoiceRequest(name="hum", prompt_tokens=want.prompt_tokens.tolist(), recording=pcm,
                                          recording_rate=rate)
    proc = vocoder_process(voices, port, log)  # (no --speaker-model)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                vocoder_pb2_grpc.VocoderStub(channel).AddVoice(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "--speaker-model" in err.value.details()
    finally:
        proc.terminate()
        proc.wait(30)
    proc = vocoder_process(voices, port, log, "--speaker-model", str(tmp_path / "speaker.onnx"))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = vocoder_pb2_grpc.VocoderStub(channel)
            codes_ = want.prompt_tokens.tolist()
            for recording, what in [(b"\x00" * 3, "16-bit PCM"),
                                    (pcm16(np.zeros(4 * rate, np.float32)), "the recording is silence"),
                                    (pcm16(hum(1.0)), "too short, give at least 3 s"),
                                    (pcm16(hum(8.0)), "at most 7.04 s"),
                                    (pcm16(hum(4.0, level=3.0)), "the recording is clipped")]:
                with pytest.raises(grpc.RpcError) as err:
                    stub.AddVoice(vocoder_pb2.AddVoiceRequest(name="x", prompt_tokens=codes_, recording=recording,
                                                              recording_rate=rate), timeout=30)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
                assert "recording:" in err.value.details() and what in err.value.details(), err.value.details()
            assert list(stub.ListVoices(vocoder_pb2.ListVoicesRequest(), timeout=10).voices) == ["a"]
            assert stub.AddVoice(request, timeout=60).kept
    finally:
        proc.terminate()
        proc.wait(30)
    got = load_voice(voices / "hum.safetensors", cfg)
    assert torch.equal(got.prompt_tokens, want.prompt_tokens)
    torch.testing.assert_close(got.prompt_mel, want.prompt_mel, atol=0, rtol=0)
    torch.testing.assert_close(got.embedding, want.embedding, atol=0, rtol=0)


def test_a_speaker_model_that_is_not_there_stops_the_vocoder_at_start(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "services.cli", "vocoder", "--port", str(free_port()),
                           "--metrics-port", str(free_port()), "--preset", "tiny-codec",
                           "--speaker-model", str(tmp_path / "campplus.onnx")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "cannot start" in proc.stderr
    assert f"--speaker-model {tmp_path / 'campplus.onnx'}: no such file" in proc.stderr


def test_a_voice_removed_mid_stream_plays_on_and_is_gone_for_new_streams_and_the_next_start(tmp_path):
    cfg = tiny().flow
    a, b = random_voice(cfg, "a", prompt_tokens=10, seed=1), random_voice(cfg, "b", prompt_tokens=12, seed=2)
    live = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a))
    both = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a, b))
    live.add_voice(b)
    tokens, schedule = codes(40, seed=7), [12, 8, 20]

    def remove_b(i):
        if i == 0:
            live.remove_voice("b")

    got = play(live, "b", tokens, schedule, remove_b)
    np.testing.assert_allclose(got, play(both, "b", tokens, schedule), atol=1e-6)   # it played on, the same
    assert live.voice_names() == ["a"] and not (live.voices_dir / "b.safetensors").exists()
    with pytest.raises(InvalidArgument, match="unknown voice 'b'"):
        MelStreamer(live, voice="b")
    with pytest.raises(NotFound, match="no voice 'b'"):
        live.remove_voice("b")
    with pytest.raises(FailedPrecondition, match="last voice"):
        live.remove_voice("a")
    assert load_vocoder(None, "tiny-codec", voices_dir=live.voices_dir).voice_names() == ["a"]
    assert live.decoder.history.held == 0


def test_a_voices_cpu_work_runs_below_the_workers_priority(tmp_path):
    """The vocoder makes a voice's mel and x-vector on a thread of its own VOICE_NICE below the process (the workers'
    threads at the process's own), so that the streams playing keep the cores."""
    import os
    import threading

    from services.vocoder.servicer import VOICE_NICE, VocoderServicer

    servicer = VocoderServicer(load_vocoder(None, "tiny-codec"))
    try:
        nice = servicer.voice_thread.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()
        assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + VOICE_NICE)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        servicer.voice_thread.shutdown()
        servicer.worker.stop()
