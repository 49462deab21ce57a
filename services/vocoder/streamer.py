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

The token decoder decides when frames come: the stand-in gives a token's frames with it, the flow a block's
frames once the block and its look-ahead tokens are in (codec/decoder.py), and the rest at the end.

With HiFT (a conditioned generator) each window also carries where the stream's source stands: the source's
phase before the window's first new frame (kept from the window before, `source_phase`) and the window's first
sample in the stream (the source noise's position). Then a window's samples are offline synthesis's, to float
error, given the receptive field (codec/hift.py) as context; the reference instead restarts the source every
call and crossfades the seam.
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
    conditions: tuple = ()  # a conditioned generator's inputs (HiFT: anchor phase, anchor, upto, first sample)


DEFAULT_LOOKAHEAD = 4  # mel frames: one token, 80 ms at hop 480


def used_here(*tensors) -> None:
    """Device tensors the current CUDA stream has just been given work on, about to be let go: their memory waits for
    that work before it is used again. A stream's first chunks run on the first-chunk lane's CUDA stream (worker.py),
    its later ones on the playing worker's, and the caching allocator hands a freed block straight back to the
    stream that made it: without this, the lane could write over a stream's kept mel frames (or the stand-in
    decoder's state) before the playing worker's queued copy of them had read them."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


class MelStreamer:
    def __init__(self, vocoder: TokenVocoder, left_context: int | None = None, lookahead: int | None = None,
                 voice: str = ""):
        """left_context: frames before each chunk (default: the generator's receptive field);
        lookahead: frames held back for the next chunk (default DEFAULT_LOOKAHEAD); voice: the flow's voice
        ("": the default; unknown: InvalidArgument listing the known ones)."""
        self.vocoder = vocoder
        self.left_context = vocoder.receptive_field[0] if left_context is None else left_context
        self.lookahead = DEFAULT_LOOKAHEAD if lookahead is None else lookahead
        self.mel: torch.Tensor | None = None  # [num_mels, kept frames]; kept frames start at frame `base`
        self.base = 0
        self.emitted = 0                      # frames whose samples have been returned
        self.tokens = 0
        self.decoder_state = vocoder.start(voice)  # the token decoder's state for this stream
        self.source_phase = torch.zeros(vocoder.harmonics) if vocoder.conditioned else None  # before frame emitted
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
        new = self.vocoder.decoder.pending_frames(self.decoder_state, tokens)
        span = self._span(self.total_frames + new, tokens is None)
        return 0 if span is None else span[2] - span[0]

    def prepare(self, tokens: list[int] | None, decoded: tuple[torch.Tensor, object] | None = None) -> Window:
        """Add tokens (None: the end of the stream) → the window that is now due (its mel None if none).
        decoded: the tokens' (frames, next decoder state), when the caller decoded several streams at once."""
        if self.ended:
            raise InvalidArgument("tokens" if tokens is not None else "end", "the stream has already ended")
        if tokens or tokens is None:
            retired = self.mel, self.decoder_state
            frames, self.decoder_state = decoded or self.vocoder.mel_chunks([(tokens, self.decoder_state)])[0]
            self.mel = frames if self.mel is None else torch.cat([self.mel, frames], dim=1)
            used_here(*retired)
            self.tokens += len(tokens or ())
        last = self.ended = tokens is None
        span = self._span(self.total_frames, last)
        if span is None:
            return Window(None, self.emitted, self.emitted, last)
        start, upto, end = span
        conditions = ()
        if self.source_phase is not None:
            conditions = (self.source_phase, torch.tensor(self.emitted - start), torch.tensor(upto - start),
                          torch.tensor(start * self.vocoder.hop_size))
        return Window(self.mel[:, start - self.base : end - self.base], start, upto, last, conditions)

    def commit(self, window: Window, wav) -> np.ndarray:
        """The window's samples (frames × hop; with conditions, (samples, [outputs])) → the samples now final;
        frees the mel no call will read."""
        if window.mel is None:
            return np.zeros(0, dtype=np.float32)
        if window.conditions:
            wav, (phase,) = wav[0], wav[1]
            # A NaN or inf phase would make every later window of the stream NaN: its source starts again instead.
            self.source_phase = phase if bool(torch.isfinite(phase).all()) else torch.zeros_like(phase)
        hop = self.vocoder.hop_size
        out = wav[(self.emitted - window.start) * hop : (window.upto - window.start) * hop]
        self.emitted = window.upto
        keep_from = max(self.base, self.emitted - self.left_context)  # what a later window can still read
        self.mel = self.mel[:, keep_from - self.base :]
        self.base = keep_from
        return out

    @staticmethod
    def zero_nonfinite(samples: np.ndarray) -> int:
        """NaN and inf samples → 0 (silence), in place → how many there were. A client would hear them as full-scale
        clicks (PCM16 takes NaN to -32768 or 0, inf to ±1 after the clip), or, as float, as NaN."""
        bad = ~np.isfinite(samples)
        count = int(np.count_nonzero(bad))
        if count:
            samples[bad] = 0.0
        return count

    def close(self) -> None:
        """The stream is over (ended, cancelled or failed): the token decoder lets go of what it held for it."""
        self.vocoder.release(self.decoder_state)

    # ---- one stream alone ---------------------------------------------------------------------------
    def push(self, tokens: list[int]) -> np.ndarray:
        """Add tokens; return the samples that are now final (possibly none)."""
        return self._run(self.prepare(tokens))

    def flush(self) -> np.ndarray:
        """End of stream: return every remaining sample."""
        return self._run(self.prepare(None))

    def _run(self, window: Window) -> np.ndarray:
        if window.mel is None:
            return self.commit(window, None)
        conditions = [window.conditions] if window.conditions else None
        return self.commit(window, self.vocoder.vocode([window.mel], [window.last], conditions)[0])
