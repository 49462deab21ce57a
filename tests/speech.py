"""Test speech: Debian's espeak-ng says a sentence (22,050 Hz), with silence around it where asked. `make tools`
installs espeak-ng; without it the tests that speak skip and say why."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest


def spoken(text: str, silence_before: float = 0.0, silence_after: float = 0.0) -> tuple[np.ndarray, int]:
    """→ (float32 samples in [-1, 1], sample rate)."""
    import soundfile as sf

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make tools installs it as root)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        samples, rate = sf.read(path, dtype="float32")
    pad = lambda seconds: np.zeros(int(seconds * rate), np.float32)  # noqa: E731
    return np.concatenate([pad(silence_before), samples, pad(silence_after)]), rate


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
