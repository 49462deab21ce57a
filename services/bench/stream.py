"""One stream as the client saw it, and what a listener would have heard (docs/architecture.md §5).

A listener starts playing at the first audio, so chunk k must arrive by t_first + (audio duration of chunks
0..k-1); it may be `jitter` late without being heard (services/common/playback.py, which the gateway's stall
metric shares). A stall is one chunk later than that, its length how late it was; a stream is stall-free when
it has none. RTF is the wall time from the request to its last audio divided by the audio's duration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.playback import JITTER_SECONDS, PlaybackClock


@dataclass
class StreamRecord:
    """Times in seconds on the client's monotonic clock (time.perf_counter)."""

    sent: float                                     # the request (a Converse session: the turn) went out
    prompt: int = 0                                 # index of its prompt
    turn: int = 0                                   # its turn in a Converse session, from 1 (0: a Synthesize call)
    code: str = "OK"                                # the call's final gRPC status
    error: str = ""
    sample_rate: int = 0
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples) of each audio chunk
    stages: dict[str, float] = field(default_factory=dict)         # the gateway's SynthesisSummary fields
    done: float = 0.0                                # the call ended (status received)
    retry_after: float | None = None                 # a refusal's retry hint, seconds (None: none came)
    barged_in: float | None = None                   # a reply spoken over (--barge-in): its last audio's arrival less
                                                     # the moment the new speech began (None: not spoken over;
                                                     # negative: no audio of it came after that moment)
    cancelled_after: float | None = None             # ... and its TurnCancelled's arrival less that moment

    @property
    def ok(self) -> bool:
        return self.code == "OK" and bool(self.chunks)

    @property
    def refused(self) -> bool:
        """Turned away by admission (RESOURCE_EXHAUSTED): the service's answer to overload."""
        return self.code == "RESOURCE_EXHAUSTED"

    @property
    def ttfa(self) -> float:
        return self.chunks[0][0] - self.sent

    @property
    def audio_seconds(self) -> float:
        return sum(n for _, n in self.chunks) / self.sample_rate if self.sample_rate else 0.0

    @property
    def rtf(self) -> float:
        return (self.chunks[-1][0] - self.sent) / self.audio_seconds

    def lateness(self) -> list[float]:
        """Seconds past its deadline that each chunk arrived (negative: early), in stream order."""
        clock = PlaybackClock(self.sample_rate)
        return [clock.arrive(at, samples) for at, samples in self.chunks]

    def stalls(self, jitter: float = JITTER_SECONDS) -> list[float]:
        """How late each stalled chunk was (seconds past its deadline), in stream order."""
        return [late for late in self.lateness() if late > jitter]

    def stall_free(self, jitter: float = JITTER_SECONDS) -> bool:
        return not self.stalls(jitter)

    def to_json(self, level_start: float | None = None) -> dict:
        """Times relative to the request's own sending; sent_s relative to `level_start` (default: itself)."""
        base = self.sent
        return {"sent_s": self.sent - (base if level_start is None else level_start),
                "prompt": self.prompt, "turn": self.turn, "code": self.code, "error": self.error, "sample_rate": self.sample_rate,
                "chunk_arrivals_s": [t - base for t, _ in self.chunks], "chunk_samples": [n for _, n in self.chunks],
                "stages": self.stages, "done_s": self.done - base if self.done else None,
                "retry_after_s": self.retry_after, "barged_in_s": self.barged_in,
                "cancelled_after_s": self.cancelled_after}
