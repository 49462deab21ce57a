"""`moss-serve voice`: a voice made from a recording (services/voice_maker.py): its codes are the encoder's, its
mel is the flow's format computed independently here, its x-vector is what the speaker model gives for the
recording's fbank, and every bad input is refused with what to give instead."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soxr
import torch

from services.encoder.checkpoint import random_tokenizer
from services.encoder.config import tiny as tiny_encoder
from services.encoder.stream import encode
from services.vocoder.codec.config import tiny as tiny_codec
from services.vocoder.codec.voice import VoiceError, load_voices
from services.voice_maker import VoiceMakerError, fbank, flow_mel, make_voice
from services.voice_maker import stand_in_speaker_model as speaker_model
from tests.speech import spoken

FLOW = tiny_codec().flow


@pytest.fixture(scope="module")
def recording():
    return spoken("This is how I sound when I speak.")


@pytest.fixture(scope="module")
def encoder():
    return random_tokenizer(tiny_encoder(), 0)


def test_a_voice_is_the_recordings_codes_mel_and_speaker_embedding(tmp_path, recording, encoder):
    samples, rate = recording
    w = speaker_model(tmp_path / "speaker.onnx")
    voice = make_voice("alto", samples, rate, encoder, tmp_path / "speaker.onnx", FLOW)
    at16k = soxr.resample(samples, rate, 16000, quality="HQ").astype(np.float32)
    codes = encode(encoder, torch.from_numpy(at16k))
    p = len(voice.prompt_tokens)
    assert voice.prompt_tokens.tolist() == codes[:p] and p >= len(codes) - 1
    # The flow's mel, computed here with numpy's FFT and librosa's filters: reflect-padded by 720 each side, not
    # centred, log of the magnitude's mel clamped at 1e-5.
    import librosa
    from spectra import stft_magnitude

    at24k = soxr.resample(samples, rate, 24000, quality="HQ").astype(np.float32)
    y = np.pad(at24k, 720, mode="reflect")
    magnitude = stft_magnitude(y, 1920, 480, center=False)
    mel = np.log(np.maximum(librosa.filters.mel(sr=24000, n_fft=1920, n_mels=80, fmin=0, fmax=8000) @ magnitude, 1e-5)).T
    assert voice.prompt_mel.shape == (4 * p, 80) and p == min(len(codes), mel.shape[0] // 4)
    np.testing.assert_allclose(voice.prompt_mel.numpy(), mel[: 4 * p], atol=2e-3)
    # The x-vector: the model's answer for the recording's fbank (Kaldi's frames: 25 ms every 10 ms, snipped).
    feats = fbank(at16k)
    assert feats.shape == (1 + (len(at16k) - 400) // 160, 80) and np.abs(feats.mean(0)).max() < 1e-3
    np.testing.assert_allclose(voice.embedding.numpy(), (feats ** 2).sum(0) @ w, rtol=1e-4)


def test_the_command_writes_a_voice_the_vocoder_loads(tmp_path, recording):
    import soundfile as sf

    samples, rate = recording
    sf.write(tmp_path / "me.wav", samples, rate)
    speaker_model(tmp_path / "speaker.onnx")
    done = subprocess.run([sys.executable, "-m", "services.cli", "voice", str(tmp_path / "me.wav"), "--name", "me",
                           "--voices-dir", str(tmp_path / "voices"), "--speaker-model", str(tmp_path / "speaker.onnx"),
                           "--preset", "tiny"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "RANDOM weights" in done.stderr and "wrote" in done.stdout
    assert list(load_voices(tmp_path / "voices", FLOW)) == ["me"]
    done = subprocess.run([sys.executable, "-m", "services.cli", "voice", str(tmp_path / "me.wav"), "--name", "me",
                           "--voices-dir", str(tmp_path / "me.wav"), "--speaker-model", str(tmp_path / "speaker.onnx"),
                           "--preset", "tiny"], capture_output=True, text=True, timeout=120)  # a file, not a directory
    assert done.returncode == 2 and "cannot write in" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_bad_inputs_are_refused_saying_what_to_give(tmp_path, recording, encoder):
    samples, rate = recording
    with pytest.raises(VoiceMakerError, match="no such file; give the codec's speaker-embedding model in ONNX"):
        make_voice("a", samples, rate, encoder, tmp_path / "missing.onnx", FLOW)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(VoiceMakerError, match="onnxruntime cannot load it"):
        make_voice("a", samples, rate, encoder, tmp_path / "junk.onnx", FLOW)
    speaker_model(tmp_path / "small.onnx", dim=100)
    with pytest.raises(VoiceError, match=r"embedding must be \[192\], got \(100,\)"):
        make_voice("a", samples, rate, encoder, tmp_path / "small.onnx", FLOW)
    speaker_model(tmp_path / "speaker.onnx")
    with pytest.raises(VoiceMakerError, match="at most 1 s"):
        make_voice("a", samples, rate, encoder, tmp_path / "speaker.onnx", FLOW, max_seconds=1.0)
    with pytest.raises(VoiceMakerError, match="voice name"):
        make_voice("no spaces", samples, rate, encoder, tmp_path / "speaker.onnx", FLOW)
    with pytest.raises(VoiceMakerError, match="too short"):
        make_voice("a", samples[: rate // 100], rate, encoder, tmp_path / "speaker.onnx", FLOW)
    (tmp_path / "text.wav").write_text("hello")
    done = subprocess.run([sys.executable, "-m", "services.cli", "voice", str(tmp_path / "text.wav"), "--name", "x",
                           "--voices-dir", str(tmp_path), "--speaker-model", str(tmp_path / "speaker.onnx"),
                           "--preset", "tiny"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not a sound file" in done.stderr


def test_flow_mel_frames():
    assert flow_mel(np.zeros(24000, np.float32)).shape == (50, 80)  # hop 480: 50 frames a second


@pytest.mark.parametrize("rate", [16000, 22050, 44100])
def test_a_long_recording_is_cut_to_a_prompt_at_its_quietest_code_boundary(rate):
    """prompt_cut: within the limit the recording is whole; past it, the cut lands on an 80 ms boundary within the
    last 2 s before the limit, in the pause there rather than in the speech around it."""
    from services.common.recording import prompt_cut

    t = np.arange(int(10 * rate)) / rate
    loud = (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    assert prompt_cut(loud[: int(6 * rate)], rate, 7.04) is not None
    assert len(prompt_cut(loud[: int(6 * rate)], rate, 7.04)) == int(6 * rate)
    gap = (t >= 5.6) & (t < 5.95)                          # a pause of 350 ms, 1.1-1.4 s before the limit
    speech = np.where(gap, 0.001 * loud, loud)
    cut = prompt_cut(speech, rate, 7.04)
    end = len(cut) / rate
    assert 5.6 < end < 5.95 and abs(end / 0.08 - round(end / 0.08)) * 0.08 * rate <= 0.5, end
    assert len(prompt_cut(loud, rate, 7.04)) == round(88 * 0.08 * rate)   # no pause: all that the limit takes
    pause_early = np.where((t >= 2.0) & (t < 2.5), 0.0, loud)              # a pause too far from the limit: not it
    assert len(prompt_cut(pause_early, rate, 7.04)) / rate > 5.0
    assert len(prompt_cut(loud, rate, 2.0)) == round(25 * 0.08 * rate)     # a limit under the shortest voice: the limit


def test_the_command_cuts_a_long_recording_as_the_api_does(tmp_path, recording, encoder):
    """make_voice(prompt_seconds): the voice of the cut recording, its prompt at most that long."""
    from services.common.recording import prompt_cut

    samples, rate = recording
    long = np.tile(samples, 5)
    speaker_model(tmp_path / "speaker.onnx")
    cut = make_voice("a", long, rate, encoder, tmp_path / "speaker.onnx", FLOW, prompt_seconds=7.04)
    want = make_voice("a", prompt_cut(long, rate, 7.04), rate, encoder, tmp_path / "speaker.onnx", FLOW)
    assert len(long) / rate > 7.04 and 0 < len(cut.prompt_tokens) <= 88
    assert torch.equal(cut.prompt_tokens, want.prompt_tokens) and torch.equal(cut.prompt_mel, want.prompt_mel)
