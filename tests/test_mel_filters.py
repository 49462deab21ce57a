"""The Slaney mel filterbank without librosa (services/common/mel_filters.py): librosa's, bit for bit, at the sizes the
encoder and the voice maker use and at others; and the encoder starts without importing librosa or scipy."""

import subprocess
import sys

import librosa
import numpy as np
import pytest

from services.common.mel_filters import hz_to_mel, mel_filters, mel_to_hz


@pytest.mark.parametrize("sample_rate, n_fft, n_mels, fmin, fmax", [
    (16000, 400, 80, 0.0, None),     # Whisper-VQ's features (encoder/features.py)
    (16000, 400, 128, 0.0, None),
    (24000, 1920, 80, 0.0, 8000.0),  # the flow's prompt mel (voice_maker.py)
    (22050, 1024, 100, 30.0, 11025.0),
    (44100, 2048, 128, 0.0, None),
])
def test_the_filters_are_librosas_bit_for_bit(sample_rate, n_fft, n_mels, fmin, fmax):
    ours = mel_filters(sample_rate, n_fft, n_mels, fmin, fmax)
    want = librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)
    assert ours.dtype == want.dtype == np.float32 and ours.shape == want.shape
    assert np.array_equal(ours, want)
    assert (ours > 0).any(axis=1).all()  # no empty triangle


def test_the_scale_is_slaneys_and_round_trips():
    hz = np.array([0.0, 200.0, 999.0, 1000.0, 1001.0, 4000.0, 8000.0])
    np.testing.assert_allclose(hz_to_mel(hz), librosa.hz_to_mel(hz), rtol=1e-12)
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(hz)), hz, rtol=1e-12, atol=1e-9)


def test_the_encoders_features_import_neither_librosa_nor_scipy():
    code = ("import sys, torch; from services.encoder.features import mel_filters; mel_filters(80); "
            "print(sorted(m for m in ('librosa', 'scipy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)
