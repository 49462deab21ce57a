"""Pacing: how far the running streams are ahead of their listeners (LLMEngine.hold_seconds)."""

from __future__ import annotations

from services.llm.sequence import Sequence


def hold_for(seqs: list[Sequence], now: float, bound: float, token_seconds: float,
             first_audio_hold: float = 0.0) -> float:
    """How long steps may wait for `seqs`: the least of what each can spare, 0 if any can spare nothing. A stream
    spares its audio lead over `bound` seconds (pacing; 0: off), or, for `first_audio_hold` seconds after its
    first audio window was sent (Sequence.window_sent), what is left of them: the vocoder is making its first
    audio, which the llm's steps on the same GPU slow down (H100: 61 → 41 ms with the llm held; docs/benchmarks.md),
    and the stream's next tokens are not due for hundreds of milliseconds."""
    if bound <= 0 and first_audio_hold <= 0:
        return 0.0
    least = float("inf")
    for seq in seqs:
        spare = 0.0
        if bound > 0 and (lead := seq.audio_lead(now, token_seconds)) is not None:
            spare = lead - bound
        if first_audio_hold > 0 and seq.window_sent is not None:
            spare = max(spare, seq.window_sent + first_audio_hold - now)
        if spare <= 0:
            return 0.0
        least = min(least, spare)
    return least
