"""One stream's chunked synthesis: token chunks in, waveform chunks out, no gaps or overlaps.

BigVGAN's output near a chunk edge depends on mel frames beyond it, so each call vocodes the new
frames with `left_context` frames before them and `lookahead` frames after them, and keeps only the
new frames' samples. The last `lookahead` frames wait for the next chunk (or the end of the stream).
Emitted samples always total frames × hop: exactly tokens × samples_per_token once flushed.

With the generator's whole receptive field as context (receptive_field.py) a stream equals offline
synthesis to float error. The defaults take the whole field on the left (it costs compute, not
latency) and DEFAULT_LOOKAHEAD frames on the right (each frame of lookahead delays audio by a frame;
the frames after a window's end are its last frame repeated, runner.py): ≥ 44 dB streamed-vs-offline
for every chunk schedule, one-token chunks included, at the 24 kHz hop-480 preset (random weights,
64 channels); 6 frames give ≥ 53 dB, 8 frames ≥ 65 dB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from services.common.errors import InvalidArgument
from services.vocoder.vocoder import TokenVocoder


@dataclass
class Window:
    """Mel frames [start, start + frames) of one stream to vocode; its samples of frames [emitted, upto)
    are kept. mel None: nothing is due. last: the stream's final window (vocoded at its exact length)."""

    mel: torch.Tensor | None
    start: int
    upto: int
    last: bool


DEFAULT_LOOKAHEAD = 4  # mel frames: one token, 80 ms at hop 480


class MelStreamer:
    def __init__(self, vocoder: TokenVocoder, left_context: int | None = None, lookahead: int | None = None):
        """left_context: frames before each chunk (default: the generator's receptive field);
        lookahead: frames held back for the next chunk (default DEFAULT_LOOKAHEAD)."""
        self.vocoder = vocoder
        self.left_context = vocoder.receptive_field[0] if left_context is None else left_context
        self.lookahead = DEFAULT_LOOKAHEAD if lookahead is None else lookahead
        self.mel: torch.Tensor | None = None  # [num_mels, kept frames]; kept frames start at frame `base`
        self.base = 0
        self.emitted = 0                      # frames whose samples have been returned
        self.tokens = 0
        self.decoder_state = None             # the token decoder's state for this stream (token_decoder.py)
        self.ended = False

    @property
    def total_frames(self) -> int:
        return self.base + (0 if self.mel is None else self.mel.shape[1])

    # ---- in two halves, for a worker that vocodes many streams' windows as one batch ---------------
    def _span(self, total: int, last: bool) -> tuple[int, int, int] | None:
        """With `total` frames decoded: the due window's (start, upto, end) frames, None if nothing is due."""
        upto = total if last else total - self.lookahead
        if upto <= self.emitted:
            return None
        return max(self.base, self.emitted - self.left_context), upto, min(total, upto + self.lookahead)

    def window_frames(self, tokens: int | None) -> int:
        """Mel frames of the window prepare() would return after this many new tokens (None: the end); 0 if
        nothing would be due. What the worker weighs a chunk by, before decoding it."""
        span = self._span(self.total_frames + (tokens or 0) * self.vocoder.decoder.cfg.frames_per_token, tokens is None)
        return 0 if span is None else span[2] - span[0]

    def prepare(self, tokens: list[int] | None, decoded: tuple[torch.Tensor, object] | None = None) -> Window:
        """Add tokens (None: the end of the stream) → the window that is now due (its mel None if none).
        decoded: the tokens' (frames, next decoder state), when the caller decoded several streams at once."""
        if self.ended:
            raise InvalidArgument("tokens" if tokens is not None else "end", "the stream has already ended")
        if tokens:
            frames, self.decoder_state = decoded or self.vocoder.mel_chunk(tokens, self.decoder_state)
            self.mel = frames if self.mel is None else torch.cat([self.mel, frames], dim=1)
            self.tokens += len(tokens)
        last = self.ended = tokens is None
        span = self._span(self.total_frames, last)
        if span is None:
            return Window(None, self.emitted, self.emitted, last)
        start, upto, end = span
        return Window(self.mel[:, start - self.base : end - self.base], start, upto, last)

    def commit(self, window: Window, wav: np.ndarray | None) -> np.ndarray:
        """The window's samples (frames × hop) → the samples now final; frees the mel no call will read."""
        if window.mel is None:
            return np.zeros(0, dtype=np.float32)
        hop = self.vocoder.hop_size
        out = wav[(self.emitted - window.start) * hop : (window.upto - window.start) * hop]
        self.emitted = window.upto
        keep_from = max(self.base, self.emitted - self.left_context)  # what a later window can still read
        self.mel = self.mel[:, keep_from - self.base :]
        self.base = keep_from
        return out

    # ---- one stream alone ---------------------------------------------------------------------------
    def push(self, tokens: list[int]) -> np.ndarray:
        """Add tokens; return the samples that are now final (possibly none)."""
        return self._run(self.prepare(tokens))

    def flush(self) -> np.ndarray:
        """End of stream: return every remaining sample."""
        return self._run(self.prepare(None))

    def _run(self, window: Window) -> np.ndarray:
        wav = None if window.mel is None else self.vocoder.vocode([window.mel], [window.last])[0]
        return self.commit(window, wav)
