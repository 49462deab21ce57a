"""Pacing: how far the running streams are ahead of their listeners (LLMEngine.hold_seconds)."""

from __future__ import annotations

from services.llm.engine.sequence import Sequence


def lead_over_bound(seqs: list[Sequence], now: float, bound: float, token_seconds: float) -> float:
    """The least audio lead over `bound` seconds among `seqs`: 0 if pacing is off (bound 0) or any of them
    is not speaking or not that far ahead."""
    least = float("inf")
    if bound <= 0:
        return 0.0
    for seq in seqs:
        lead = seq.audio_lead(now, token_seconds)
        if lead is None or lead <= bound:
            return 0.0
        least = min(least, lead - bound)
    return least
