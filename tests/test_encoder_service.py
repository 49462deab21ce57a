"""The encoder service as a real process on a free loopback port (tiny preset, CPU): spoken turns → codes equal to
the offline encoding of the same audio, speech found in silence, bad audio refused by field, and every speaker's place
given back however a call ends."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from moss.speech.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

from services.encoder.checkpoint import random_tokenizer
from services.encoder.config import tiny
from services.encoder.speech_input import SpeechInput
from services.encoder.stream import encode
from services.stack import Ports, Stack
from tests.conftest import metric_value, scrape
from tests.speech import pcm16, spoken

PCM16, FLOAT32 = common_pb2.AUDIO_FORMAT_PCM16, common_pb2.AUDIO_FORMAT_FLOAT32
CHUNK = 2205  # 100 ms at espeak-ng's 22,050 Hz


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    stack = Stack(Ports.free(), extra_args={"encoder": ["--max-speakers", "2", "--max-listeners", "4",
                                                        "--max-turn-seconds", "8"]},
                  log_dir=tmp_path_factory.mktemp("encoder-logs"))
    stack.start("encoder")
    try:
        stack.wait_serving(["encoder"])
        yield stack
    finally:
        stack.stop("encoder")


@pytest.fixture(scope="module")
def sentence():
    return spoken("Hello, what is the weather like in Paris today?", 1.0, 1.0)


def config(rate, fmt=PCM16, detect=False, end_silence=0.0):
    return encoder_pb2.EncodeRequest(config=encoder_pb2.EncodeConfig(sample_rate=rate, format=fmt, detect_speech=detect,
                                                                      end_silence_seconds=end_silence))


def audio(pcm: bytes):
    return encoder_pb2.EncodeRequest(audio=encoder_pb2.AudioData(pcm=pcm))


END = encoder_pb2.EncodeRequest(end=encoder_pb2.EndOfTurn())


async def call(target: str, messages, pause: float = 0.0) -> list[encoder_pb2.EncodeResponse]:
    """The messages written (`pause` seconds apart), then the responses read; a call the service ended early (a
    refusal) raises its own status, not the error of a write after its end."""
    async with grpc.aio.insecure_channel(target) as channel:
        rpc = encoder_pb2_grpc.EncoderStub(channel).Encode(timeout=60)
        try:
            for message in messages:
                await rpc.write(message)
                await asyncio.sleep(pause)
            await rpc.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the call has ended: reading it raises its status
        return [r async for r in rpc]


async def refused(target: str, *messages: encoder_pb2.EncodeRequest) -> grpc.aio.AioRpcError:
    """The status of a call that writes `messages`, the last the one the service refuses, then nothing until it has
    read the refusal (EncodeRefused: said before the status, so that no write races it), then its half-close: the
    error the service ends it with, which says what the refusal said."""
    async with grpc.aio.insecure_channel(target) as channel:
        hold = asyncio.Event()

        async def requests():
            for message in messages:
                yield message
            await hold.wait()

        said = None
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for reply in encoder_pb2_grpc.EncoderStub(channel).Encode(requests(), timeout=60):
                if reply.WhichOneof("kind") == "refused":
                    said = reply.refused
                    hold.set()  # the half-close: the status follows at once
        assert said is not None and (said.code, said.message) == (err.value.code().name, err.value.details())
        return err.value


def chunks(pcm: bytes, size: int) -> list:
    return [audio(pcm[i : i + size]) for i in range(0, len(pcm), size)]


def at_16k(samples: np.ndarray, rate: int, sizes: int) -> np.ndarray:
    """What the service's resampler makes of the same chunks (speech_input.py)."""
    speech = SpeechInput(rate, PCM16, 600)
    pcm = pcm16(samples)
    out = [speech.push(pcm[i : i + 2 * sizes]) for i in range(0, len(pcm), 2 * sizes)]
    return np.concatenate([*out, speech.end()])


def test_a_turn_gives_the_offline_codes_of_its_audio(encoder, sentence):
    samples, rate = sentence
    replies = asyncio.run(call(encoder.target("encoder"), [config(rate), *chunks(pcm16(samples), 2 * CHUNK), END]))
    assert [r.WhichOneof("kind") for r in replies] == ["turn"]
    turn = replies[0].turn
    model = random_tokenizer(tiny(), 0)  # the service's: the tiny preset, seed 0, float32 on the CPU
    expected = encode(model, __import__("torch").from_numpy(at_16k(samples, rate, CHUNK)))
    assert list(turn.codes) == expected and len(expected) == pytest.approx(len(samples) / rate * 12.5, abs=1)
    assert turn.speech_detected and turn.audio_seconds == pytest.approx(len(samples) / rate, abs=0.01)


def test_with_detection_the_speech_is_found_encoded_and_ends_the_turn(encoder, sentence):
    """No `end` is sent: the speech's end ends the call, and the silence before the speech is not encoded."""
    samples, rate = sentence
    messages = [config(rate, detect=True, end_silence=0.4), *chunks(pcm16(samples), 2 * CHUNK)]
    replies = asyncio.run(call(encoder.target("encoder"), messages + [audio(pcm16(np.zeros(rate * 5)))]))
    kinds = [r.WhichOneof("kind") for r in replies]
    assert kinds == ["started", "ended", "turn"]
    start, end = replies[0].started.audio_seconds, replies[1].ended.audio_seconds
    voiced = np.flatnonzero(np.abs(samples) > 0.01) / rate
    assert voiced[0] - 0.25 <= start <= voiced[0] and voiced[-1] - 0.2 <= end <= voiced[-1] + 0.3
    turn = replies[2].turn
    assert turn.audio_seconds == pytest.approx(end - start, abs=1e-3)
    speech = at_16k(samples, rate, CHUNK)[round(start * 16000) : round(end * 16000)]
    assert list(turn.codes) == encode(random_tokenizer(tiny(), 0), __import__("torch").from_numpy(speech))


def test_silence_alone_gives_no_codes(encoder):
    replies = asyncio.run(call(encoder.target("encoder"), [config(16000, detect=True), audio(pcm16(np.zeros(16000))), END]))
    assert [r.WhichOneof("kind") for r in replies] == ["turn"]
    assert not replies[0].turn.speech_detected and not replies[0].turn.codes


@pytest.mark.parametrize("messages, field", [
    ([audio(b"\0\0")], "config: the first message of an Encode call must be a config"),
    ([config(4000)], "config.sample_rate: 4000 Hz; give the audio's rate, 8000-192000 Hz"),
    ([config(16000), audio(b"\0\0\0")], "audio.pcm: 3 bytes is not a whole number of 2-byte samples"),
    ([config(16000, FLOAT32), audio(np.array([0, np.nan], "<f4").tobytes())], "audio.pcm: sample 1 is not a finite number"),
    ([config(16000), END], "audio: the turn has no audio"),
    ([config(16000), audio(pcm16(np.zeros(16000 * 9)))], "audio: the turn is longer than 8 s"),
    ([config(16000), config(16000)], "config: only audio or end may follow the config"),
    ([config(16000, detect=True, end_silence=-1)],
     "config.end_silence_seconds: -1 s; give 0 (the encoder's default) to 10 s"),
    ([config(16000, detect=True, end_silence=11)],
     "config.end_silence_seconds: 11 s; give 0 (the encoder's default) to 10 s"),
])
def test_bad_audio_is_refused_naming_the_field(encoder, messages, field):
    err = asyncio.run(refused(encoder.target("encoder"), *messages))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == field


def test_every_place_is_given_back_however_a_call_ends(encoder):
    """Two speaker places: two open turns take them, a third is refused with a retry hint; a cancelled call and a
    failed one give theirs back, and the metrics say so."""
    target, metrics_port = encoder.target("encoder"), encoder.ports.metrics["encoder"]

    async def scenario():
        async with grpc.aio.insecure_channel(target) as channel:
            stub = encoder_pb2_grpc.EncoderStub(channel)
            queues = [asyncio.Queue() for _ in range(2)]

            async def requests(q):
                while (m := await q.get()) is not None:
                    yield m

            calls = [stub.Encode(requests(q), timeout=60) for q in queues]
            for q in queues:
                await q.put(config(16000))
                await q.put(audio(pcm16(np.random.default_rng(0).normal(0, 0.1, 16000))))
            await asyncio.sleep(1.0)
            assert metric_value(scrape(metrics_port), "encoder_speakers") == 2
            err = await refused(target, config(16000))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ("retry-after-ms", "1000") in tuple(err.trailing_metadata() or ())
            calls[0].cancel()                                   # one call cancelled
            await queues[1].put(audio(b"\0"))                    # the other fails (half a sample)
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in calls[1]:
                    pass
            for _ in range(50):
                if metric_value(scrape(metrics_port), "encoder_speakers") == 0:
                    break
                await asyncio.sleep(0.1)
            assert metric_value(scrape(metrics_port), "encoder_speakers") == 0
            assert metric_value(scrape(metrics_port), "encoder_calls") == 0
            replies = await call(target, [config(16000), audio(pcm16(np.zeros(16000))), END])
            assert len(replies[0].turn.codes) == 13  # 1 s at 12.5 codes a second, padded to a whole code

    asyncio.run(scenario())


def test_listeners_beyond_the_most_are_refused(encoder):
    async def scenario():
        async with grpc.aio.insecure_channel(encoder.target("encoder")) as channel:
            stub = encoder_pb2_grpc.EncoderStub(channel)
            q = asyncio.Queue()

            async def requests():
                yield config(16000, detect=True)
                while (m := await q.get()) is not None:
                    yield m

            listening = [stub.Encode(requests(), timeout=60) for _ in range(4)]
            await asyncio.sleep(1.0)
            err = await refused(encoder.target("encoder"), config(16000))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--max-listeners" in err.details()
            for c in listening:
                c.cancel()

    asyncio.run(scenario())
