"""One stream's chunked synthesis: token chunks in, waveform chunks out, no gaps or overlaps.

BigVGAN's output near a chunk edge depends on mel frames beyond it, so each call vocodes the new
frames with `left_context` frames before them and `lookahead` frames after them, and keeps only the
new frames' samples. The last `lookahead` frames wait for the next chunk (or the end of the stream).
Emitted samples always total frames × hop: exactly tokens × samples_per_token once flushed.
How close the stream comes to offline synthesis depends on the context (benchmarked later).
"""

from __future__ import annotations

import numpy as np
import torch

from services.vocoder.vocoder import TokenVocoder


class MelStreamer:
    def __init__(self, vocoder: TokenVocoder, left_context: int = 16, lookahead: int = 4):
        self.vocoder = vocoder
        self.left_context = left_context
        self.lookahead = lookahead
        self.mel: torch.Tensor | None = None  # [num_mels, kept frames]; kept frames start at frame `base`
        self.base = 0
        self.emitted = 0                      # frames whose samples have been returned
        self.tokens = 0

    @property
    def total_frames(self) -> int:
        return self.base + (0 if self.mel is None else self.mel.shape[1])

    def push(self, tokens: list[int]) -> np.ndarray:
        """Add tokens; return the samples that are now final (possibly none)."""
        frames = self.vocoder.mel(tokens)
        self.mel = frames if self.mel is None else torch.cat([self.mel, frames], dim=1)
        self.tokens += len(tokens)
        return self._emit(self.total_frames - self.lookahead)

    def flush(self) -> np.ndarray:
        """End of stream: return every remaining sample."""
        return self._emit(self.total_frames)

    def _emit(self, upto: int) -> np.ndarray:
        if upto <= self.emitted:
            return np.zeros(0, dtype=np.float32)
        start = max(self.base, self.emitted - self.left_context)
        end = min(self.total_frames, upto + self.lookahead)
        wav = self.vocoder.waveform(self.mel[:, start - self.base : end - self.base])
        hop = self.vocoder.hop_size
        out = wav[(self.emitted - start) * hop : (upto - start) * hop]
        self.emitted = upto
        # Keep only the frames a later call can still read as left context.
        keep_from = max(self.base, self.emitted - self.left_context)
        self.mel = self.mel[:, keep_from - self.base :]
        self.base = keep_from
        return out
