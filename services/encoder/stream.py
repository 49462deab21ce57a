"""One user's speech → its codes, encoded while it arrives (features.py, then whisper_vq.py's stream).

The reference encodes a turn's audio in independent 30 s segments (`segment_samples`), each padded to a whole code,
and keeps every code. A stream does the same as its samples come: each segment's features and codes as its samples
arrive, its last code when it is closed (full, or at the end of the turn). Should the segment's floor have risen
after a frame it floors (features.py), the segment is encoded again from its final features, so the codes are
always the offline ones (`encode`).
"""

from __future__ import annotations

import torch

from services.encoder import features
from services.encoder.kv_pool import KVPool
from services.encoder.whisper_vq import WhisperVQEncoder


class EncoderStream:
    """One turn's speech. It holds a slot of the pool from its start (PoolFull: no room for another speaker) to its
    finish or abort; `feed_streams` and `finish_streams` encode many streams' samples in one call each."""

    def __init__(self, model: WhisperVQEncoder, pool: KVPool | None = None):
        """pool: the keys and values it takes a slot of (default: a slot of its own)."""
        w = model.codebook.weight
        self.model, self.cfg = model, model.cfg
        self.pool = pool if pool is not None else KVPool(model.cfg, 1, w.device, w.dtype)
        self.codes: list[int] = []   # of the closed segments
        self.reencoded = 0           # segments encoded again (their floor rose after a frame it floors)
        self.done = False
        self._open()

    def _open(self) -> None:
        self.features = features.StreamingLogMel(self.cfg.num_mel_bins)
        self.state = self.model.start(self.pool)
        self.pending: list[torch.Tensor] = []  # the open segment's codes so far

    def feed(self, samples: torch.Tensor) -> None:
        """The next samples [n] (float, 16 kHz)."""
        feed_streams([(self, samples)])

    def finish(self) -> list[int]:
        """The end of the turn → every code of it; the slot goes back."""
        return finish_streams([self])[0]

    def abort(self) -> None:
        """The turn is dropped (cancelled, or its caller gone): its slot goes back; idempotent."""
        if not self.done:
            self.done = True
            self.pool.give(self.state.slot)

def _encode(streams: list[EncoderStream], mels: list[torch.Tensor]) -> None:
    """One model call for the streams' new frames (all on one model and pool)."""
    if not streams:
        return
    model, pool = streams[0].model, streams[0].pool
    for stream, codes in zip(streams, model.feed([s.state for s in streams], mels, pool)):  # (feed moves the frames)
        stream.pending.append(codes)


@torch.inference_mode()
def feed_streams(items: list[tuple[EncoderStream, torch.Tensor]]) -> None:
    """Each stream's next samples [n_i], encoded together (one model call a round; a second round only for samples
    past a segment's end, every 30 s of a stream)."""
    while items:
        streams, now, rest = [], [], []
        for stream, samples in items:
            if stream.done:
                raise ValueError("samples after the end of the turn")
            room = stream.cfg.segment_samples - stream.features.received
            streams.append(stream)
            now.append(samples[:room])
            if len(samples) >= room:
                rest.append((stream, samples[room:]))
        _encode(streams, features.feed_many([s.features for s in streams], now))
        full = [stream for stream, _ in rest]  # a full segment: its last frames, its last code, the next segment
        _encode(full, features.finish_many([s.features for s in full]))
        _reencode(_close(full, reopen=True))
        items = [(stream, samples) for stream, samples in rest if len(samples)]


@torch.inference_mode()
def finish_streams(streams: list[EncoderStream]) -> list[list[int]]:
    """The ends of the streams' turns, their last frames encoded together → each turn's codes."""
    live = [s for s in streams if not s.done and s.features.received]
    _encode(live, features.finish_many([s.features for s in live]))
    for stream in streams:
        if not stream.done and not stream.features.received:  # nothing since the last segment (or at all): no code
            stream.abort()
    _reencode(_close(live, reopen=False))
    return [s.codes for s in streams]


def _close(streams: list[EncoderStream], reopen: bool) -> list[tuple[EncoderStream, torch.Tensor | None]]:
    """The streams' open segments, their features all in and encoded: their last codes, then each one's next segment
    (reopen) or its end. → each with its segment's final features if its floor rose (features.py): to be encoded
    again (`_reencode`), its codes so far left out; else None. One wait for the device for all of them."""
    if not streams:
        return []
    model, pool = streams[0].model, streams[0].pool
    parts = [[*s.pending, last] for s, last in zip(streams, model.finish_many([s.state for s in streams], pool))]
    again = features.refloored_many([s.features for s in streams])
    flat, at = torch.cat([p for segment in parts for p in segment]).tolist(), 0
    for stream, segment, final in zip(streams, parts, again):
        n = sum(len(p) for p in segment)
        if final is None:
            stream.codes += flat[at : at + n]
        at += n
        if reopen:
            stream._open()
        else:
            stream.done = True
    return list(zip(streams, again))


def _reencode(closed: list[tuple[EncoderStream, torch.Tensor | None]]) -> None:
    """The closed segments whose floor rose, encoded again from their final features [n_mels, T]: one offline batch
    per length (at the end of turns that began with digital silence, many speakers' segments may need it at once), in
    the streams' pool where it has room (the slots they just gave back; the layers' graphs are over it)."""
    by_length: dict[int, list[tuple[EncoderStream, torch.Tensor]]] = {}
    for stream, final in closed:
        if final is not None:
            by_length.setdefault(final.shape[1], []).append((stream, final))
    for group in by_length.values():
        model, pool = group[0][0].model, group[0][0].pool
        codes = model(torch.stack([f for _, f in group]).to(model.codebook.weight), pool).tolist()
        for (stream, _), row in zip(group, codes):
            stream.codes += row
            stream.reencoded += 1


@torch.inference_mode()
def encode(model: WhisperVQEncoder, samples: torch.Tensor) -> list[int]:
    """Offline, as the reference does it: 30 s segments, each padded to a code, its features, its codes."""
    codes = []
    for start in range(0, len(samples), model.cfg.segment_samples):
        segment = features.pad_to_code(samples[start : start + model.cfg.segment_samples])
        mel = features.offline(segment, model.cfg.num_mel_bins)
        codes += model(mel[None].to(model.codebook.weight))[0].tolist()
    return codes
