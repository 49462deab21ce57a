"""The Slaney mel filterbank (librosa.filters.mel's default: Slaney's mel scale, each triangle normalised to unit
area), the same float32 values in the same order of operations, without librosa: importing it pulls in scipy.signal,
~3.4 s of CPU at every encoder start. Whisper's features (encoder/features.py) and the flow's prompt mel
(voice_maker.py) use it; tests/test_mel_filters.py compares it with librosa's, bit for bit."""

from __future__ import annotations

import numpy as np

# Slaney's scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4)
F_SP = 200.0 / 3
MIN_LOG_HZ = 1000.0
MIN_LOG_MEL = MIN_LOG_HZ / F_SP
LOG_STEP = np.log(6.4) / 27.0


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asanyarray(hz, dtype=np.float64)
    mel = hz / F_SP
    high = hz >= MIN_LOG_HZ
    return np.where(high, MIN_LOG_MEL + np.log(np.maximum(hz, MIN_LOG_HZ) / MIN_LOG_HZ) / LOG_STEP, mel)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asanyarray(mel, dtype=np.float64)
    hz = F_SP * mel
    return np.where(mel >= MIN_LOG_MEL, MIN_LOG_HZ * np.exp(LOG_STEP * (mel - MIN_LOG_MEL)), hz)


def mel_filters(sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None) -> np.ndarray:
    """→ [n_mels, n_fft // 2 + 1] float32: triangle i rises from band edge i to i + 1 and falls to i + 2 (n_mels + 2
    edges evenly spaced in mels from fmin to fmax, default half the sample rate), scaled by 2 / its width in Hz."""
    fmax = sample_rate / 2 if fmax is None else fmax
    bins = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)                          # [n_fft // 2 + 1] Hz
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))   # [n_mels + 2] Hz
    widths = np.diff(edges)
    ramps = np.subtract.outer(edges, bins)                                         # [n_mels + 2, bins]
    weights = np.zeros((n_mels, len(bins)), dtype=np.float32)
    for i in range(n_mels):  # (row by row into float32, then scaled: librosa's roundings)
        weights[i] = np.maximum(0, np.minimum(-ramps[i] / widths[i], ramps[i + 2] / widths[i + 1]))
    weights *= (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels]))[:, np.newaxis]
    return weights
