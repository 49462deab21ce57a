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
    def __init__(self, model: WhisperVQEncoder, pool: KVPool | None = None):
        """pool: the keys and values it takes a slot of while a segment is open (default: a slot of its own)."""
        w = model.codebook.weight
        self.model, self.cfg = model, model.cfg
        self.pool = pool if pool is not None else KVPool(model.cfg, 1, w.device, w.dtype)
        self.codes: list[int] = []   # of the closed segments
        self.reencoded = 0           # segments encoded again (their floor rose after a frame it floors)
        self._open()

    def _open(self) -> None:
        self.features = features.StreamingLogMel(self.cfg.num_mel_bins)
        self.state = self.model.start(self.pool)
        self.pending: list[torch.Tensor] = []  # the open segment's codes so far

    @torch.inference_mode()
    def feed(self, samples: torch.Tensor) -> None:
        """The next samples [n] (float, 16 kHz)."""
        while len(samples):
            room = self.cfg.segment_samples - self.features.received
            part, samples = samples[:room], samples[room:]
            self._encode(self.features.feed(part))
            if self.features.received == self.cfg.segment_samples:
                self._close()

    @torch.inference_mode()
    def finish(self) -> list[int]:
        """The end of the turn → every code of it."""
        if self.features.received:
            self._close()
        return self.codes

    def _encode(self, mel: torch.Tensor) -> None:
        if mel.shape[1]:
            self.pending.append(self.model.feed([self.state], [mel.to(self.model.codebook.weight)], self.pool)[0])

    def _close(self) -> None:
        self._encode(self.features.finish())
        codes = torch.cat([*self.pending, self.model.finish(self.state, self.pool)])
        again = self.features.refloored()
        if again is not None:
            codes = self.model(again[None].to(self.model.codebook.weight))[0]
            self.reencoded += 1
        self.codes += codes.tolist()
        self._open()


@torch.inference_mode()
def encode(model: WhisperVQEncoder, samples: torch.Tensor) -> list[int]:
    """Offline, as the reference does it: 30 s segments, each padded to a code, its features, its codes."""
    codes = []
    for start in range(0, len(samples), model.cfg.segment_samples):
        segment = features.pad_to_code(samples[start : start + model.cfg.segment_samples])
        mel = features.offline(segment, model.cfg.num_mel_bins)
        codes += model(mel[None].to(model.codebook.weight))[0].tolist()
    return codes
