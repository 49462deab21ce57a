"""A listener's playback clock (docs/architecture.md §5): when each chunk of a stream had to arrive, and how late
it was. Playing starts at the first audio, so chunk k is due at t_first + the audio duration of chunks
0..k-1; it may be `JITTER_SECONDS` late unheard. A later chunk is a stall, its length how late it was.

The bench client runs it on the arrival times it recorded; the gateway runs it as it sends each chunk.
"""

from __future__ import annotations

JITTER_SECONDS = 0.020


class PlaybackClock:
    def __init__(self, sample_rate: int):
        self.rate = sample_rate
        self.first: float | None = None  # when the first audio arrived: playing starts
        self.samples = 0                 # audio arrived so far

    def due(self) -> float | None:
        """When the next chunk must arrive (None before the first: it is never late)."""
        return None if self.first is None else self.first + self.samples / self.rate

    def arrive(self, at: float, samples: int) -> float:
        """A chunk of `samples` arrived at `at` (seconds, any monotonic clock) → seconds past its deadline
        (negative: early; 0 for the first chunk)."""
        due = self.due()
        if due is None:
            self.first = due = at
        self.samples += samples
        return at - due
