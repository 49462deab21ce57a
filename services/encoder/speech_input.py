"""A spoken turn's audio as a client sends it → the 16 kHz float samples the encoder reads.

The client declares a sample rate and a format (PCM16 or float32, mono, little-endian) and streams chunks of bytes.
Each chunk is checked and resampled to 16 kHz as it comes (soxr's streaming resampler: the same samples as
resampling the whole turn at once). Bad audio is refused with InvalidArgument naming the field, and the session
can go on: a rate outside 8-192 kHz, a chunk that is not whole samples, a NaN or infinite float, a turn longer
than `max_seconds`, a turn with no audio, audio after the turn's end.
"""

from __future__ import annotations

import numpy as np

from services.common.audio import BYTES_PER_SAMPLE, FLOAT32, decode_pcm, resolve_format
from services.common.errors import InvalidArgument
from services.encoder.config import SAMPLE_RATE

MIN_RATE, MAX_RATE = 8_000, 192_000
MAX_END_SILENCE_SECONDS = 10.0  # a pause longer than this is not the end of a turn anyone waits for


def check_end_silence(seconds: float) -> None:
    """InvalidArgument for a silence that ends speech under detection that the encoder does not take (0: its default;
    the gateway checks a SpeechInput's with it, as check_rate)."""
    if not 0 <= seconds <= MAX_END_SILENCE_SECONDS:  # (NaN too)
        raise InvalidArgument("end_silence_seconds", f"{seconds:g} s; give 0 (the encoder's default) to "
                                                     f"{MAX_END_SILENCE_SECONDS:g} s")


def check_rate(sample_rate: int) -> None:
    """InvalidArgument for a rate the encoder does not take (the gateway checks a SpeechInput's with it, before any
    audio goes anywhere)."""
    if not MIN_RATE <= sample_rate <= MAX_RATE:
        raise InvalidArgument("sample_rate", f"{sample_rate} Hz; give the audio's rate, {MIN_RATE}-{MAX_RATE} Hz")


class SpeechInput:
    def __init__(self, sample_rate: int, fmt: int, max_seconds: float):
        check_rate(sample_rate)
        import soxr  # (imported here: only the encoder's side needs it)

        self.rate, self.fmt = sample_rate, resolve_format(fmt, "format")
        self.max_samples = int(max_seconds * sample_rate)
        self.received = 0
        self.ended = False
        self.resampler = None if sample_rate == SAMPLE_RATE else soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1,
                                                                                     dtype="float32", quality="HQ")

    def push(self, pcm: bytes) -> np.ndarray:
        """A chunk of the turn's audio → its samples at 16 kHz (float32, possibly none yet: the resampler's delay)."""
        if self.ended:
            raise InvalidArgument("audio", "audio after the end of the turn")
        width = BYTES_PER_SAMPLE[self.fmt]
        if len(pcm) % width:
            raise InvalidArgument("audio.pcm", f"{len(pcm)} bytes is not a whole number of {width}-byte samples")
        samples = decode_pcm(pcm, self.fmt)
        if self.fmt == FLOAT32 and not np.isfinite(samples).all():
            at = int(np.flatnonzero(~np.isfinite(samples))[0])
            raise InvalidArgument("audio.pcm", f"sample {self.received + at} is not a finite number")
        self.received += len(samples)
        if self.received > self.max_samples:
            raise InvalidArgument("audio", f"the turn is longer than {self.max_samples / self.rate:g} s")
        return samples if self.resampler is None else self.resampler.resample_chunk(samples)

    def end(self) -> np.ndarray:
        """The turn's end → the resampler's last samples (InvalidArgument for a turn with no audio)."""
        if self.ended:
            raise InvalidArgument("end", "the turn has ended already")
        self.ended = True
        if not self.received:
            raise InvalidArgument("audio", "the turn has no audio")
        if self.resampler is None:
            return np.zeros(0, np.float32)
        return self.resampler.resample_chunk(np.zeros(0, np.float32), last=True)
