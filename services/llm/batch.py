"""What one engine step computes: the scheduler makes it, a runner runs it (engine/ and runner/ both read it)."""

from __future__ import annotations

from dataclasses import dataclass

from services.llm.sequence import Sequence


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_tokens: list[int]  # positions of each sequence computed this step, from seq.num_cached
