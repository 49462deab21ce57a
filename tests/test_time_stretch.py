"""The HTTP door's `speed` (services/gateway/time_stretch.py): WSOLA keeps the pitch, makes round(n / speed)
samples of n, plays 1.0 back unchanged, and gives the same samples however the stream was chunked."""

from __future__ import annotations

import numpy as np
import pytest

from services.gateway.time_stretch import TimeStretch

RATE = 24000


def tones(seconds: float = 2.0, freqs=(220.0, 660.0)) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (8000 * np.sin(2 * np.pi * freqs[0] * t) + 2000 * np.sin(2 * np.pi * freqs[1] * t)).astype("<i2")


def stretch(x: np.ndarray, speed: float, chunk: int | None = None) -> np.ndarray:
    ts, chunk = TimeStretch(speed, RATE), chunk or max(1, len(x))
    out = b"".join(ts.feed(x[i:i + chunk].tobytes()) for i in range(0, len(x), chunk)) + ts.finish()
    return np.frombuffer(out, dtype="<i2")


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.25, 2.0, 4.0])
def test_the_pitch_stays_and_the_length_scales(speed):
    x = tones()
    y = stretch(x, speed, chunk=1920 * 5)  # the vocoder's chunks: 5 tokens of 80 ms
    assert len(y) == round(len(x) / speed)
    body = y[len(y) // 8: len(y) // 8 + 8192].astype(float)
    spectrum = np.abs(np.fft.rfft(body * np.hanning(len(body)))) ** 2
    freqs = np.fft.rfftfreq(len(body), 1 / RATE)
    assert abs(freqs[np.argmax(spectrum)] - 220.0) < 3.0  # the same pitch, not 220 × speed
    near_tones = sum(spectrum[np.abs(freqs - f) < 15].sum() for f in (220.0, 660.0))
    assert near_tones / spectrum.sum() > 0.99, "frames were joined out of phase (clicks or beating)"
    assert abs(body.std() / x.astype(float).std() - 1) < 0.05  # no fade where frames overlap


def test_chunking_does_not_change_the_samples():
    x = tones(1.3)
    for speed in (0.7, 1.5, 3.0):
        whole = stretch(x, speed)
        for chunk in (1, 97, 1920, 24000):
            assert np.array_equal(stretch(x, speed, chunk), whole), (speed, chunk)


def test_speed_one_gives_back_the_input():
    x = tones(0.7)
    assert np.abs(stretch(x, 1.0, chunk=1000).astype(int) - x.astype(int)).max() <= 1


def test_short_and_empty_streams():
    assert len(stretch(np.zeros(0, "<i2"), 2.0)) == 0
    assert len(stretch(tones(0.001), 0.5)) == round(24 / 0.5)


def test_a_speed_outside_openais_range_is_refused():
    with pytest.raises(ValueError, match="outside 0.25-4.0"):
        TimeStretch(5.0, RATE)
