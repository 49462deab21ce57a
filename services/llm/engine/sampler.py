"""Sampling both heads: repetition penalty, temperature, top-k, top-p, seeded per request.

Both heads are sampled every step (the state machine in sequence.py decides which sample is used).
The audio head is masked above the last valid id, and eosp is suppressed before min_new_tokens.
"""

from __future__ import annotations

import torch

from services.common.sampling import SamplingSettings
from services.llm.model.config import MossSpeechConfig
from services.llm.engine.sequence import Sequence


class PenaltyHistory:
    """Tokens a sequence has seen, per channel, updated with each new position instead of rescanning.
    Text: every text-channel id but modality_pad. Audio: the codes of audio segments (positions whose
    text channel is modality_pad); the audio_pad of text positions is not a code the model chose."""

    def __init__(self):
        self.upto = 0
        self.text: set[int] = set()
        self.audio: set[int] = set()

    def update(self, seq: Sequence, modality_pad: int) -> "PenaltyHistory":
        for t, a in zip(seq.text_ids[self.upto :], seq.audio_ids[self.upto :]):
            if t == modality_pad:
                self.audio.add(a)
            else:
                self.text.add(t)
        self.upto = len(seq)
        return self


def apply_repetition_penalty(logits: torch.Tensor, seen: set[int], penalty: float) -> torch.Tensor:
    """HF convention: a seen token's positive logit is divided by the penalty, a negative one multiplied."""
    if penalty == 1.0 or not seen:
        return logits
    idx = torch.tensor(sorted(seen), dtype=torch.long, device=logits.device)
    idx = idx[idx < logits.shape[-1]]
    seen = logits[idx]
    logits = logits.clone()
    logits[idx] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits


def sample_logits(logits: torch.Tensor, s: SamplingSettings, generator: torch.Generator | None) -> int:
    """logits [vocab] float32 (already penalised and masked) → one token id."""
    if s.temperature == 0.0:
        return int(torch.argmax(logits))
    logits = logits / s.temperature
    if 0 < s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, -1)
        # Drop a token when the tokens ranked above it already cover top_p (the first always stays).
        drop = probs.cumsum(-1) - probs > s.top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    probs = torch.softmax(logits, -1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


class Sampler:
    def __init__(self, cfg: MossSpeechConfig):
        self.cfg = cfg

    def audio_mask(self, logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
        logits = logits.clone()
        logits[self.cfg.audio_logits_limit:] = float("-inf")
        if seq.num_steps < seq.sampling.min_new_tokens:
            logits[self.cfg.eosp_token_id] = float("-inf")
        return logits

    def __call__(self, seqs: list[Sequence], text_logits: torch.Tensor, audio_logits: torch.Tensor):
        """text_logits [B, text_vocab], audio_logits [B, audio_vocab] → [(text_token, audio_token)] * B."""
        out = []
        for i, seq in enumerate(seqs):
            s = seq.sampling
            if seq.penalty_history is None:
                seq.penalty_history = PenaltyHistory()
            seen = seq.penalty_history.update(seq, self.cfg.modality_pad_token_id)
            t = apply_repetition_penalty(text_logits[i], seen.text, s.repetition_penalty)
            a = apply_repetition_penalty(self.audio_mask(audio_logits[i], seq), seen.audio, s.repetition_penalty)
            out.append((sample_logits(t, s, seq.generator), sample_logits(a, s, seq.generator)))
        return out
