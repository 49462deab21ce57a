"""PCM encoding and WAV files. Samples are float32 in [-1, 1], mono."""

from __future__ import annotations

import wave

import numpy as np

from services.common.errors import InvalidArgument

PCM16, FLOAT32 = 1, 2  # moss.speech.v1.AudioFormat values
BYTES_PER_SAMPLE = {PCM16: 2, FLOAT32: 4}


def resolve_format(fmt: int, field: str) -> int:
    """A client's AudioFormat → PCM16 or FLOAT32 (unspecified means PCM16); unknown values refused."""
    if fmt == 0:
        return PCM16
    if fmt not in BYTES_PER_SAMPLE:
        raise InvalidArgument(field, f"unknown audio format {fmt}; use AUDIO_FORMAT_PCM16 or AUDIO_FORMAT_FLOAT32")
    return fmt


def encode_pcm(samples: np.ndarray, fmt: int) -> bytes:
    """float32 [n] → little-endian bytes in `fmt`."""
    samples = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    if fmt == PCM16:
        return (samples * 32767.0).round().astype("<i2").tobytes()
    if fmt == FLOAT32:
        return samples.astype("<f4").tobytes()
    raise ValueError(f"unknown audio format {fmt}")


def decode_pcm(data: bytes, fmt: int) -> np.ndarray:
    if fmt == PCM16:
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0
    if fmt == FLOAT32:
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    raise ValueError(f"unknown audio format {fmt}")


def write_wav(path: str, samples: np.ndarray, sample_rate: int) -> None:
    """Mono 16-bit WAV."""
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(encode_pcm(samples, PCM16))


def read_audio(path: str) -> tuple[np.ndarray, int]:
    """A sound file (channels mixed down) → (float32 samples, rate); ValueError saying why it cannot be read."""
    import os

    if not os.path.isfile(path):
        raise ValueError(f"cannot read {path}: no such file")
    return _read(path, path)


def read_audio_bytes(data: bytes, what: str = "the file") -> tuple[np.ndarray, int]:
    """A sound file's bytes (WAV, FLAC, Ogg, ...: what libsndfile reads) → (float32 samples, channels mixed down, rate);
    ValueError saying why not."""
    import io

    return _read(io.BytesIO(data), what)


def _read(source, what: str) -> tuple[np.ndarray, int]:
    import soundfile as sf

    try:
        samples, rate = sf.read(source, dtype="float32", always_2d=True)
    except (OSError, RuntimeError, TypeError) as exc:  # (soundfile's LibsndfileError is a RuntimeError)
        raise ValueError(f"cannot read {what}: {exc} (not a sound file soundfile can read)") from None
    if not len(samples):
        raise ValueError(f"cannot read {what}: no audio")
    return samples.mean(axis=1), rate
