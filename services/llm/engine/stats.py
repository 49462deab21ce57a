"""What the engine reports of itself, as plain data: its load now, what each step did, totals since start. The
llm's servicer and metrics turn them into Prometheus metrics (services/llm/metrics.py); the engine imports none."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineLoad:
    running: int   # requests that step (held ones are not)
    waiting: int   # requests that would step if there were room
    blocks_used: int
    blocks_free: int
    sessions: int
    held: int = 0  # requests held (their listeners stopped taking audio): no steps, no running place


@dataclass
class StepStats:
    """What one step did, with monotonic timings in seconds."""

    duration: float = 0.0
    batch_size: int = 0
    prefill_tokens: int = 0     # prompt (or recomputed) positions computed
    decode_tokens: int = 0
    token_intervals: list[float] = field(default_factory=list)  # per decode token: since the seq's last token
    prefill_durations: list[float] = field(default_factory=list)  # first token of a seq: since it was scheduled
    preemptions: int = 0
    prefix_hit_tokens: int = 0  # prompt positions served from the cache, for sequences admitted this step
    prefix_queried_tokens: int = 0
    place: str = ""             # where it ran with a GPU share (gpu_share.py: "whole" or "share"), else ""


@dataclass
class EngineCounters:
    """Totals since start, for tests and metrics."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    steps: int = 0
    steps_ahead: int = 0     # decode steps launched before the previous step's samples reached the host
    voided_samples: int = 0  # samples of such steps thrown away: the previous sample switched mode or ended
