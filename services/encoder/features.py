"""Whisper's log-mel features, offline and as audio arrives.

    samples [N] at 16 kHz → STFT (n_fft 400, hop 160, Hann, centred: reflect-padded 200 samples each side; the last
    frame dropped) → power → 128 Slaney mel bands → log10 (floor 1e-10) → max(x, segment max - 8) → (x + 4) / 4
                                                                                         [n_mels, N / 160]

That is the reference's feature extractor (transformers' WhisperFeatureExtractor), which the tokenizer was trained
on. Its reference pads each segment's samples with zeros to a multiple of 1,280 (one code: `pad_to_code`) first.

A stream computes frame t once samples up to 160·t + 200 have arrived (its window lies in them; the first two read
the start reflected), and the last frame at the end, reflected there. Every frame's value before the floor is then
the offline one. The floor is not: it is 8 below the maximum of the whole segment, which a stream has not heard yet.
`StreamingLogMel` floors each frame at the maximum so far; at the end, `refloored()` says whether any frame would have
come out otherwise, i.e. whether a frame lay more than 8 (80 dB) below a maximum that came after it. A frame of a
batch floored at f (every frame of a batch gets the same) came out otherwise iff both its value and f lie below the
final floor; so the stream keeps only the least, over its batches, of max(the batch's lowest value, f), and compares
it with the final floor at the end. When so, the caller encodes the segment again from the final features
(stream.py): codes then always equal the offline ones, and the usual speech (no frame 80 dB below the loudest
one before it is heard) is never encoded twice.
"""

from __future__ import annotations

import functools

import torch

from services.common.mel_filters import mel_filters as slaney_mel
from services.encoder.config import HOP, SAMPLE_RATE

N_FFT = 400
PAD = N_FFT // 2          # the centred STFT's reflection at each end
CODE_SAMPLES = 1280       # samples a code covers: 8 mel frames
FLOOR = 8.0               # log10 units below the segment's maximum (80 dB)


@functools.cache
def mel_filters(n_mels: int) -> torch.Tensor:
    """[n_mels, 201]: Slaney-scale, Slaney-normalised triangles over the STFT's bins (Whisper's, librosa's default)."""
    return torch.from_numpy(slaney_mel(SAMPLE_RATE, N_FFT, n_mels))


def pad_to_code(samples: torch.Tensor) -> torch.Tensor:
    """samples [N] → zeros appended up to a multiple of CODE_SAMPLES (the reference's pad_to_multiple_of)."""
    return torch.nn.functional.pad(samples, (0, -len(samples) % CODE_SAMPLES))


@functools.cache
def hann(device: str) -> torch.Tensor:
    return torch.hann_window(N_FFT, device=device)


def log10_mel(windows_signal: torch.Tensor, n_mels: int) -> torch.Tensor:
    """Signals already padded as the frames need ([..., PAD + ...]: frame f's window starts at HOP·f), one or a
    batch of like ones [B, L] → every whole window's log10 mel power [(B,) n_mels, frames], before the floor."""
    spec = torch.stft(windows_signal.float(), N_FFT, HOP, window=hann(str(windows_signal.device)), center=False,
                      return_complex=True)                                                   # [(B,) 201, frames]
    return torch.clamp(mel_filters(n_mels).to(spec.device) @ spec.abs().pow(2), min=1e-10).log10()


def finish_features(raw: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """log10 mel [n_mels, T] and the floor's level (a 0-d tensor) → the encoder's input, max(x, level), (x + 4) / 4."""
    return (torch.maximum(raw, floor) + 4.0) / 4.0


def offline(samples: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """One segment's samples [N] (N a multiple of HOP, > PAD: pad_to_code makes it so) → [n_mels, N / HOP]."""
    padded = torch.nn.functional.pad(samples[None, None].float(), (PAD, PAD), mode="reflect")[0, 0]
    raw = log10_mel(padded, n_mels)[:, :-1]  # the centred STFT's extra last frame, dropped as the reference does
    return finish_features(raw, raw.max() - FLOOR)


class StreamingLogMel:
    """One segment's features as its samples arrive (module docstring): `feed` → the frames its samples complete,
    `finish` → the rest, once the segment's samples are all in (padded to a code). `feed_many` feeds many segments
    at once."""

    def __init__(self, n_mels: int = 128):
        self.n_mels = n_mels
        self.tail: list[torch.Tensor] = []       # the samples from tail_start on: what the next frames read
        self.tail_start = 0
        self.received = 0
        self.frames = 0                          # frames given out
        self.raw: list[torch.Tensor] = []        # their log10 mel, before the floor
        self.lowest: torch.Tensor | None = None  # min over batches of max(lowest value, its floor) (docstring)
        self.peak: torch.Tensor | None = None    # on the samples' device: no wait for it while streaming

    def feed(self, samples: torch.Tensor) -> torch.Tensor:
        """New samples [n] (float, 16 kHz) → the frames they complete [n_mels, k] (k may be 0)."""
        return feed_many([self], [samples])[0]

    def finish(self) -> torch.Tensor:
        """The segment's samples are all in → they are padded to a code and the remaining frames come out."""
        return finish_many([self])[0]

    def _end(self) -> tuple[torch.Tensor, int] | None:
        """The segment's samples are all in: padded to a code → the signal of its remaining frames (`_region`)."""
        pad = -self.received % CODE_SAMPLES
        like = self.tail[0] if self.tail else torch.zeros(0)
        self.tail.append(like.new_zeros(pad))
        self.received += pad
        if self.received <= PAD:
            raise ValueError(f"a segment of {self.received} samples: Whisper's features need more than {PAD}")
        return self._region(self.received // HOP)

    def _take(self, samples: torch.Tensor) -> tuple[torch.Tensor, int] | None:
        """New samples in → the signal of the frames they complete and how far they go (None: no new frame)."""
        self.tail.append(samples.float())
        self.received += len(samples)
        if self.received <= PAD:  # the start's reflection needs PAD + 1 samples
            return None
        return self._region((self.received - PAD) // HOP + 1)  # frames 0 .. that - 1 have their whole window here

    def _region(self, upto: int) -> tuple[torch.Tensor, int] | None:
        """Frames [self.frames, upto): frame f's window is the samples [HOP·f - PAD, HOP·f + PAD), reflected at the
        segment's start (frames 0 and 1) and, at its end, past its last sample → their signal, padded so
        (log10_mel's input), and `upto`; None if there is no such frame. Reads the tail only: a call costs its own
        frames, not the segment's."""
        tail = torch.cat(self.tail) if len(self.tail) > 1 else self.tail[0]
        self.tail = [tail]
        if upto <= self.frames:
            return None
        start, stop = HOP * self.frames - PAD, HOP * (upto - 1) + N_FFT - PAD     # absolute samples, as padded
        before, after = max(-start, 0), max(stop - self.received, 0)
        # (the start's reflection reads samples 1 .. before: past `stop` when the first frame comes alone)
        hi = max(min(stop, self.received), min(self.received, before + 1))
        region = tail[max(start, 0) - self.tail_start : hi - self.tail_start]
        if before or after:
            region = torch.nn.functional.pad(region[None, None], (before, after), mode="reflect")[0, 0]
        return region[: stop - start], upto

    def _keep(self, raw: torch.Tensor, peak: torch.Tensor, lowest: torch.Tensor, upto: int) -> None:
        """The new frames' log10 mel [n_mels, k], the segment's maximum so far (theirs included) and `lowest` so far
        (theirs included): kept; the tail moves past what no later frame reads."""
        self.peak, self.lowest = peak, lowest
        self.raw.append(raw)
        self.frames = upto
        keep = max(HOP * upto - PAD, 0)  # the next frame's first sample
        self.tail, self.tail_start = [self.tail[0][keep - self.tail_start :]], keep

    def refloored(self) -> torch.Tensor | None:
        """After finish: the whole segment's features [n_mels, T] if any frame came out other than offline gives it
        (a frame below the final floor got a lower one); else None."""
        return refloored_many([self])[0]


def feed_many(streams: list[StreamingLogMel], samples: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each segment's new samples [n_i] → the frames they complete, per segment [n_mels, k_i], as each one's `feed`
    gives them (`_frames_many`)."""
    return _frames_many(streams, [stream._take(x) for stream, x in zip(streams, samples)])


def finish_many(streams: list[StreamingLogMel]) -> list[torch.Tensor]:
    """Each segment's end (its samples all in) → its remaining frames, as each one's `finish` gives them."""
    return _frames_many(streams, [stream._end() for stream in streams])


def _frames_many(streams: list[StreamingLogMel], regions: list) -> list[torch.Tensor]:
    """Each segment's region of new frames (`_region`; None: none) → their features, kept. Regions that span as many
    samples (speakers sending like chunks) share one STFT, one mel product and one floor update: a call's features
    are a few ops a group, not a dozen a speaker."""
    out = [s.tail[0].new_zeros(s.n_mels, 0) if r is None else None for s, r in zip(streams, regions)]
    groups: dict[int, list[int]] = {}
    for i, region in enumerate(regions):
        if region is not None:
            groups.setdefault(len(region[0]), []).append(i)
    for members in groups.values():
        raw = log10_mel(torch.stack([regions[i][0] for i in members]), streams[members[0]].n_mels)  # [G, n_mels, k]
        peaks = raw.amax((1, 2))
        before = torch.stack([streams[i].peak if streams[i].peak is not None else peaks[j]
                              for j, i in enumerate(members)])
        peaks = torch.maximum(before, peaks)
        lows = torch.maximum(raw.amin((1, 2)), peaks - FLOOR)
        lows = torch.minimum(torch.stack([streams[i].lowest if streams[i].lowest is not None else lows[j]
                                          for j, i in enumerate(members)]), lows)
        features = finish_features(raw, (peaks - FLOOR)[:, None, None])
        for j, i in enumerate(members):
            streams[i]._keep(raw[j], peaks[j], lows[j], regions[i][1])
            out[i] = features[j]
    return out


def refloored_many(streams: list[StreamingLogMel]) -> list[torch.Tensor | None]:
    """After finish, for each segment: its whole features [n_mels, T] if any frame came out other than offline gives
    it (a frame below the final floor got a lower one: it must be encoded again); else None. One wait for the
    device for all of them."""
    if not streams:
        return []
    finals = torch.stack([s.peak for s in streams]) - FLOOR
    flagged = (torch.stack([s.lowest for s in streams]) < finals).tolist()
    return [finish_features(torch.cat(s.raw, 1), final) if again else None
            for s, again, final in zip(streams, flagged, finals)]
