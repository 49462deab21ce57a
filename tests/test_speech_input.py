"""A spoken turn's audio as clients send it (services/encoder/speech_input.py): resampled to 16 kHz as it comes,
the same as at once; each kind of bad audio refused naming its field."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from services.common.audio import FLOAT32, PCM16, encode_pcm
from services.common.errors import InvalidArgument
from services.encoder.speech_input import SpeechInput


def tone(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.mark.parametrize("rate, fmt", [(48_000, PCM16), (22_050, FLOAT32), (16_000, PCM16)])
def test_chunks_resample_as_the_whole_turn_does(rate, fmt):
    audio = tone(rate, 1.0)
    pcm = encode_pcm(audio, fmt)
    width = 2 if fmt == PCM16 else 4
    speech = SpeechInput(rate, fmt, max_seconds=5)
    cuts = np.cumsum(np.random.default_rng(rate).integers(1, 4000, 40)) * width
    parts = [speech.push(pcm[a:b]) for a, b in zip([0, *cuts], [*cuts, len(pcm)]) if a < len(pcm)]
    got = np.concatenate([*parts, speech.end()])
    whole = np.frombuffer(pcm, "<i2").astype(np.float32) / 32767 if fmt == PCM16 else audio
    want = whole if rate == 16_000 else soxr.resample(whole, rate, 16_000, quality="HQ")
    np.testing.assert_array_equal(got, want)
    assert len(got) == 16_000


def test_bad_audio_is_refused_naming_the_field():
    with pytest.raises(InvalidArgument, match=r"^sample_rate: 0 Hz"):
        SpeechInput(0, PCM16, 5)
    with pytest.raises(InvalidArgument, match=r"^format: unknown audio format 7"):
        SpeechInput(16_000, 7, 5)
    speech = SpeechInput(16_000, PCM16, max_seconds=1)
    with pytest.raises(InvalidArgument, match=r"^audio\.pcm: 3 bytes is not a whole number of 2-byte samples"):
        speech.push(b"\x00\x01\x02")
    with pytest.raises(InvalidArgument, match=r"^audio: the turn is longer than 1 s"):
        speech.push(bytes(2 * 16_001))
    floats = SpeechInput(16_000, FLOAT32, 5)
    floats.push(encode_pcm(np.zeros(10, np.float32), FLOAT32))
    with pytest.raises(InvalidArgument, match=r"^audio\.pcm: sample 12 is not a finite number"):
        floats.push(np.array([0.0, 0.1, np.nan], "<f4").tobytes())
    with pytest.raises(InvalidArgument, match=r"^audio: the turn has no audio"):
        SpeechInput(16_000, PCM16, 5).end()
    ended = SpeechInput(16_000, PCM16, 5)
    ended.push(bytes(4))
    ended.end()
    with pytest.raises(InvalidArgument, match=r"^audio: audio after the end of the turn"):
        ended.push(bytes(4))
