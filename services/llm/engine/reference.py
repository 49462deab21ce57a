"""Reference checks of the engine against the model itself: the logits each step sampled from, and one
dense forward over a whole sequence (tests and bench/llm_engine.py compare the two)."""

from __future__ import annotations

import torch

from services.llm.engine.engine import LLMEngine
from services.llm.model.model import MossSpeechForCausalLM
from services.llm.sequence import Mode, Sequence


def traced_generation(engine: LLMEngine, seq: Sequence) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
    """Reference check: run `seq` to the end, keeping the logits of each step that sampled it:
    (text [V], None) in text mode, (None, audio [V]) in audio mode — each step computes only the head
    its mode samples. Other queued sequences run along as usual."""
    logits = []

    def keep(seqs, text, audio):
        text_rows = [s for s in seqs if s.mode is Mode.TEXT]
        audio_rows = [s for s in seqs if s.mode is Mode.AUDIO]
        if seq in text_rows:
            logits.append((text[text_rows.index(seq)].clone(), None))
        elif seq in audio_rows:
            logits.append((None, audio[audio_rows.index(seq)].clone()))

    engine.on_logits = keep
    engine.add(seq)
    try:
        while engine.has_work():
            engine.step()
    finally:
        engine.on_logits = None
    return logits


def dense_logits(model: MossSpeechForCausalLM, text_ids: list[int], audio_ids: list[int]):
    """Reference: one dense forward over a whole sequence → all positions' logits (text, audio)."""
    device = next(model.parameters()).device
    t = torch.tensor(text_ids, device=device)
    a = torch.tensor(audio_ids, device=device)
    return model(t, a, torch.arange(len(text_ids), device=device))
