"""Speech → codes as it arrives (services/encoder/features.py, stream.py): Whisper's log-mel against librosa's, the
streamed features and codes equal to the offline ones however the samples are chunked, across 30 s segments, and
when a later loud frame raises the floor of earlier quiet ones."""

from __future__ import annotations

import librosa
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from spectra import stft_magnitude

from services.encoder import features
from services.encoder.config import tiny
from services.encoder.kv_pool import KVPool
from services.encoder.stream import EncoderStream, encode, feed_streams, finish_streams
from services.encoder.whisper_vq import WhisperVQEncoder

init = KVPool.__init__


def noise(n: int, seed: int, level: float = 0.1) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * level


def whisper_by_librosa(samples: torch.Tensor, n_mels: int) -> np.ndarray:
    """Whisper's features written with numpy's FFT and librosa's mel filters (an independent STFT and mel): centred,
    reflect-padded, last frame dropped, log10, floor 8 below the maximum, (x + 4) / 4."""
    power = stft_magnitude(samples.numpy().astype(np.float64), 400, 160, center=True) ** 2
    mel = (librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels) @ power)[:, :-1]
    log = np.log10(np.maximum(mel, 1e-10))
    return (np.maximum(log, log.max() - 8.0) + 4.0) / 4.0


def test_the_features_are_whispers():
    t = torch.arange(24_000) / 16_000
    samples = features.pad_to_code(0.3 * torch.sin(2 * torch.pi * 220 * t) * torch.sin(2 * torch.pi * 3 * t) + noise(24_000, 1, 0.01))
    ours = features.offline(samples, 128)
    assert ours.shape == (128, len(samples) // 160) == (128, 152)
    np.testing.assert_allclose(ours.numpy(), whisper_by_librosa(samples, 128), atol=2e-4)


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(0, 7000), max_size=8))
def test_streamed_features_are_the_offline_ones(cuts):
    samples = noise(7000, 2)
    stream = features.StreamingLogMel(16)
    bounds = [0, *sorted(cuts), len(samples)]
    frames = [stream.feed(samples[a:b]) for a, b in zip(bounds, bounds[1:])] + [stream.finish()]
    torch.testing.assert_close(torch.cat(frames, 1), features.offline(features.pad_to_code(samples), 16))
    assert stream.refloored() is None  # noise at one level: no frame lies 80 dB below a later one


@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(0, 7000), max_size=6), speakers=st.integers(2, 4))
def test_segments_fed_together_each_get_their_own_features(cuts, speakers):
    """Speakers sending like chunks share one STFT a call (features.feed_many); their levels differ, so a floor or a
    frame taken from the wrong row shows."""
    turns = [noise(7000, 10 + i, level=0.05 * (i + 1)) for i in range(speakers)]
    turns[0][:2000] = 0.0  # one whose floor rises later: it must keep its own
    streams = [features.StreamingLogMel(16) for _ in turns]
    bounds = [0, *sorted(cuts), 7000]
    got = [[] for _ in turns]
    for a, b in zip(bounds, bounds[1:]):
        for frames, mine in zip(features.feed_many(streams, [t[a:b] for t in turns]), got):
            mine.append(frames)
    for stream, turn, mine in zip(streams, turns, got):
        alone = features.StreamingLogMel(16)
        want = [alone.feed(turn[a:b]) for a, b in zip(bounds, bounds[1:])]
        torch.testing.assert_close(torch.cat(mine, 1), torch.cat(want, 1))
        torch.testing.assert_close(torch.cat([*mine, stream.finish()], 1), torch.cat([*want, alone.finish()], 1))
        assert (stream.refloored() is None) == (alone.refloored() is None)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return WhisperVQEncoder(tiny()).eval()


def speech_after_silence() -> torch.Tensor:
    """Digital silence, then loud noise: the silent frames' floor rises when the noise starts (features.py)."""
    samples = noise(9000, 3, 0.5)
    samples[:4000] = 0.0
    return samples


@settings(max_examples=8, deadline=None)
@given(cuts=st.lists(st.integers(0, 30_000), max_size=6), silence_first=st.booleans())
def test_streamed_codes_are_the_offline_ones_across_segments(model, cuts, silence_first):
    """30,000 samples: three of the tiny config's segments (12,800 samples), the last padded to a code."""
    samples = noise(30_000, 4)
    if silence_first:
        samples[:3000] = 0.0
    stream = EncoderStream(model)
    bounds = [0, *sorted(cuts), len(samples)]
    for a, b in zip(bounds, bounds[1:]):
        stream.feed(samples[a:b])
    codes = stream.finish()
    assert len(codes) == 10 + 10 + 4 and codes == encode(model, samples)
    # encoded again: at most the segment with the silence (when its silent frames came out before the noise did)
    assert stream.reencoded <= int(silence_first)


def test_a_floor_that_rises_later_is_caught_and_the_segment_encoded_again(model):
    samples = speech_after_silence()
    stream = features.StreamingLogMel(16)
    streamed = torch.cat([stream.feed(samples[:4800]), stream.feed(samples[4800:]), stream.finish()], 1)
    offline = features.offline(features.pad_to_code(samples), 16)
    assert not torch.allclose(streamed, offline)  # the silent frames got the silence's own floor
    torch.testing.assert_close(stream.refloored(), offline)
    encoder = EncoderStream(model)
    encoder.feed(samples[:4800])
    encoder.feed(samples[4800:])
    assert encoder.finish() == encode(model, samples) and encoder.reencoded == 1


def test_speakers_whose_floor_rose_are_encoded_again_together(model, monkeypatch):
    """Turns that began with digital silence, ended in one call: their segments are encoded again in one batch per
    length, in the slots they gave back (no pool of their own: the service's graphs are over its pool), and each
    gets its own offline codes."""
    turns = [speech_after_silence(), speech_after_silence() * 0.5, speech_after_silence()[:6000]]
    pool = KVPool(model.cfg, 3)
    streams = [EncoderStream(model, pool) for _ in turns]
    feed_streams([(s, t[:4800]) for s, t in zip(streams, turns)])
    feed_streams([(s, t[4800:]) for s, t in zip(streams, turns)])
    pools = []
    monkeypatch.setattr(KVPool, "__init__", lambda self, *a, **k: pools.append(a) or init(self, *a, **k))
    got = finish_streams(streams)
    monkeypatch.undo()
    assert pools == []
    assert got == [encode(model, t) for t in turns]
    assert streams[0].reencoded == streams[1].reencoded == 1 and pool.used() == 0  # (the first two: one batch)


def test_an_empty_turn_has_no_codes_and_a_short_one_has_one(model):
    assert EncoderStream(model).finish() == []
    stream = EncoderStream(model)
    stream.feed(noise(100, 5))  # less than a window: padded to one code at the end
    assert len(stream.finish()) == 1
