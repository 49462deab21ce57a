"""The HTTP door's `speed` (OpenAI's speaking rate, 0.25-4.0): a turn's PCM16 played faster or slower at the same
pitch, chunk by chunk as it streams, by WSOLA (waveform-similarity overlap-add; Verhelst & Roelands, 1993).

Output frames of FRAME_SECONDS, Hann-windowed, are laid down every half frame (the windows then sum to 1). Output
frame k reads the input near k × hop × speed, shifted by up to ±TOLERANCE_SECONDS to where the input looks most like
the natural continuation of frame k-1 (the input that followed it), so that periods line up and nothing clicks or
beats. Each frame needs the input up to one frame and the tolerance past its place: ~30 ms, so first audio waits
~30 ms more. n samples in make round(n / speed) out; the output does not depend on how the input was chunked.
"""

from __future__ import annotations

import numpy as np

from services.common.sampling import PLAYBACK_SPEEDS

FRAME_SECONDS = 0.02
TOLERANCE_SECONDS = 0.01


class TimeStretch:
    def __init__(self, speed: float, sample_rate: int):
        if not PLAYBACK_SPEEDS[0] <= speed <= PLAYBACK_SPEEDS[1]:
            raise ValueError(f"speed {speed} is outside {PLAYBACK_SPEEDS[0]}-{PLAYBACK_SPEEDS[1]}")
        self.speed = speed
        self.hop = max(1, round(FRAME_SECONDS * sample_rate / 2))  # output hop: half a frame
        self.frame = 2 * self.hop
        self.tolerance = round(TOLERANCE_SECONDS * sample_rate)
        n = np.arange(self.frame)
        self.window = (0.5 - 0.5 * np.cos(2 * np.pi * n / self.frame)).astype(np.float32)  # periodic Hann
        # The input as it came, with `hop` zeros in front so that the first output frame is centred on sample 0
        # (its rising half would fade the start in otherwise): input index i is buffer index i + hop - base.
        self.buffer = np.zeros(self.hop, np.float32)
        self.base = 0            # the buffer's first sample, in padded input indices
        self.received = 0        # input samples so far
        self.k = 0               # the next output frame
        self.previous: int | None = None  # where frame k-1 was read from (padded input index)
        self.tail = np.zeros(self.hop, np.float32)  # frame k-1's second half, to be added to frame k's first
        self.emitted = 0         # output samples so far, counting the `hop` dropped at the start

    def feed(self, pcm: bytes) -> bytes:
        """PCM16 in → the PCM16 that can be made of it so far."""
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        self.buffer = np.concatenate([self.buffer, samples])
        self.received += len(samples)
        return self._frames(self.hop + self.received)

    def finish(self) -> bytes:
        """→ the rest: round(n / speed) samples in all for n in."""
        total = round(self.received / self.speed)
        self.buffer = np.concatenate([self.buffer, np.zeros(self.frame + 2 * self.tolerance + int(self.hop * self.speed) + 1,
                                                            np.float32)])
        out = [self._frames(None, until=total + self.hop)]
        return self._trim(b"".join(out), total)

    def _trim(self, pcm: bytes, total: int) -> bytes:
        """At the end: exactly `total` samples in all (the last frame's overshoot cut)."""
        sent_before = self.emitted - len(pcm) // 2 - self.hop
        keep = max(0, total - max(0, sent_before))
        return pcm[:2 * keep]

    def _frames(self, available: int | None, until: int | None = None) -> bytes:
        """Output frames while the input they read has come (`available` padded samples; None: the input has
        ended and is padded with silence, so frames go on until `until` output samples)."""
        parts = []
        while True:
            nominal = round(self.k * self.hop * self.speed)
            lo = max(0, nominal - self.tolerance)
            hi = nominal + self.tolerance + self.frame  # the search region's end
            need = hi if self.previous is None else max(hi, self.previous + self.hop + self.frame)
            if until is not None:
                if self.emitted >= until:
                    break
            elif need > available:
                break
            start = nominal if self.previous is None else self._best(lo, hi)
            segment = self.buffer[start - self.base:start - self.base + self.frame] * self.window
            out = self.tail + segment[:self.hop]
            self.tail = segment[self.hop:].copy()
            parts.append(out)
            self.previous = start
            self.k += 1
            self.emitted += self.hop
            self._drop(min(lo, self.previous) - self.base)
        if not parts:
            return b""
        out = np.concatenate(parts)
        dropped = max(0, self.hop - (self.emitted - len(out)))  # the padding's half frame, at the very start
        return np.clip(np.rint(out[dropped:]), -32768, 32767).astype("<i2").tobytes()

    def _best(self, lo: int, hi: int) -> int:
        """The frame start in [lo, hi - frame] whose input best matches what followed the previous frame."""
        target = self.buffer[self.previous + self.hop - self.base:self.previous + self.hop + self.frame - self.base]
        if not target.any():  # what followed was silence (as at the end): nothing to match, so follow on from it
            return min(max(self.previous + self.hop, lo), hi - self.frame)
        region = self.buffer[lo - self.base:hi - self.base]
        size = 1 << int(len(region) + self.frame).bit_length()
        shifts = len(region) - self.frame + 1
        corr = np.fft.irfft(np.fft.rfft(region, size) * np.conj(np.fft.rfft(target, size)), size)[:shifts]
        # normalized by each candidate's energy, so that a louder stretch of input does not win for being loud
        energy = np.concatenate([[0.0], np.cumsum(region.astype(np.float64) ** 2)])
        norm = np.sqrt(np.maximum(energy[self.frame:self.frame + shifts] - energy[:shifts], 0.0) + 1.0)  # (≥ 1: silence)
        return lo + int(np.argmax(corr / norm))

    def _drop(self, n: int) -> None:
        """Forget input no later frame reads (before the next search region and the next continuation)."""
        if n > 0:
            self.buffer = self.buffer[n:]
            self.base += n
