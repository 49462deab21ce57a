"""An STFT written with numpy, for the tests' independent references (with librosa's mel filters): librosa's own stft
compiles numba functions at its first call in a fresh environment, ~30 s of a clean CI run."""

from __future__ import annotations

import numpy as np
from scipy.signal import get_window


def stft_magnitude(y: np.ndarray, n_fft: int, hop: int, center: bool) -> np.ndarray:
    """|STFT| [n_fft // 2 + 1, frames] with a periodic Hann window of n_fft (center: reflect-padded by n_fft // 2 each
    side first), librosa.stft's framing."""
    if center:
        y = np.pad(y, n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(y, n_fft)[::hop]       # [frames, n_fft]
    return np.abs(np.fft.rfft(frames * get_window("hann", n_fft, fftbins=True), axis=1)).T
