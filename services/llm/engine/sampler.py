"""Sampling on the device, batched over rows, with no host synchronisation.

Each step samples one head per sequence: the text head for a sequence in text mode, the audio head for
one in audio mode (the other head's sample would be ignored by the state machine in sequence.py, so it
is neither computed nor sampled). Per row: repetition penalty, audio masks, temperature, top-k, top-p,
then one draw. Everything is a tensor op over [rows, vocab]; the engine reads the chosen ids back once.

**Noise is a function of (seed, step, token id)** — a counter-based hash, not a stateful generator — so
a row's sample depends only on its own logits and settings, never on which other requests share the
batch, whether the batch took the top-k or the full-sort path, or a preemption and recompute. A draw is
Gumbel-max: argmax over kept tokens of z + g, z the tempered logits and g = -log(-log u) with u the
hashed uniform; that is an exact sample from softmax(z) over the kept tokens.

**Numerically safe for every value the API accepts** (temperature in [0, 2], top_p in (0, 1], any
top_k >= 0, repetition penalty in (0, 10], any logits): logits are masked and clamped to finite values
after the penalty (a penalty of 1e-45 turns 5.0 into inf), the row maximum is subtracted before
dividing by the temperature, and temperatures below `GREEDY_BELOW` pick the argmax (the distribution's
limit; 1e-45 would otherwise divide by a denormal). A row whose model logits are not finite is reported
as faulty (`ok` False) and the engine ends that request alone.

**Repetition penalty** (HF convention: a seen token's positive logit is divided by the penalty, a
negative one multiplied) uses per-slot seen-token masks kept on the device: slot = a running sequence's
row in `seen_text [slots, text_vocab]` / `seen_audio [slots, audio_vocab]` (bool). Text: every
text-channel id but modality_pad. Audio: the codes of audio segments (positions whose text channel is
modality_pad); the audio_pad of text positions is not a code the model chose.
"""

from __future__ import annotations

import torch

from services.common.tensors import Uploader
from services.llm.model.config import MossSpeechConfig
from services.llm.sampling import AUDIO_SALT, GREEDY_BELOW, TEXT_SALT, TOPK_CAP, RowSettings, sample_rows
from services.llm.sequence import Mode, Sequence


class Samples:
    """One step's samples: on the device for feeding the next step at once, on their way to the host.

    ids [R] int64 on the device, in the order of `seqs`; `result()` waits for this step alone (an event
    after its copy into pinned memory, not the stream, which may already run the next step)."""

    def __init__(self, seqs: list[Sequence], ids: torch.Tensor, ok: torch.Tensor, host: torch.Tensor):
        self.seqs, self.ids = seqs, ids
        both = torch.stack([ids, ok.long()])  # [2, R]
        if ids.is_cuda:
            self.host = host[: both.numel()].view(both.shape)  # contiguous: a strided target would make the copy sync
            self.host.copy_(both, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host, self.event = both, None

    def result(self) -> list[tuple[int, bool]]:
        """→ [(token, ok)] per sequence: the step's one device → host read."""
        if self.event is not None:
            self.event.synchronize()
        ids, ok = self.host.tolist()
        return [(token, bool(good)) for token, good in zip(ids, ok)]


class Sampler:
    """Samples each sequence's current head. Owns the seen-token masks, one slot per running sequence."""

    def __init__(self, cfg: MossSpeechConfig, max_slots: int, device: torch.device, upload: Uploader | None = None,
                 fused: bool | None = None):
        """fused: the candidate path in Triton kernels (runner/kernels/sampling.py); default: on CUDA."""
        self.cfg = cfg
        self.device = device
        self.fused = None  # the fused candidate path: runner/kernels/sampling.sample_candidates, or None
        if (device.type == "cuda") if fused is None else fused:
            from services.llm.runner.kernels.sampling import sample_candidates  # Triton: imported only when used

            self.fused = sample_candidates
        self.upload = upload or Uploader(device)
        self.true = torch.ones((), dtype=torch.bool, device=device)  # a device value: a host scalar would sync
        self.seen_text = torch.zeros(max_slots, cfg.vocab_size, dtype=torch.bool, device=device)
        self.seen_audio = torch.zeros(max_slots, cfg.audio_vocab_size, dtype=torch.bool, device=device)
        self.free_slots = list(range(max_slots - 1, -1, -1))
        self.fresh: list[int] = []  # slots handed out whose masks still hold a previous owner's tokens
        # Pinned landing places for the samples of the steps in flight (at most two, plus one spare).
        pinned = device.type == "cuda"
        self.landing = [torch.zeros(2 * max_slots, dtype=torch.long, pin_memory=pinned) for _ in range(3)]
        self.launches = 0

    # ---- slots ---------------------------------------------------------------------------------
    def release(self, seq: Sequence) -> None:
        """The sequence left the running batch (finished, aborted or preempted)."""
        if seq.slot is not None:
            self.free_slots.append(seq.slot)
            seq.slot, seq.seen_upto = None, 0

    def assign(self, seqs: list[Sequence]) -> None:
        """Give each running sequence without one a slot (the runner keys its block-table rows by it too)."""
        for seq in seqs:
            if seq.slot is None:
                seq.slot, seq.seen_upto = self.free_slots.pop(), 0
                self.fresh.append(seq.slot)

    def _observe(self, seqs: list[Sequence]) -> None:
        """Bring each sequence's seen masks up to its current tokens: one copy and two scatters for the batch."""
        text_hits, audio_hits = [], []  # (slot, id) pairs
        pad = self.cfg.modality_pad_token_id
        self.assign(seqs)
        fresh, self.fresh = self.fresh, []
        for seq in seqs:
            for t, a in zip(seq.text_ids[seq.seen_upto :], seq.audio_ids[seq.seen_upto :]):
                if t == pad:
                    audio_hits.append((seq.slot, a))
                else:
                    text_hits.append((seq.slot, t))
            seq.seen_upto = len(seq)
        if fresh:
            idx = self.upload(torch.tensor(fresh))
            self.seen_text.index_fill_(0, idx, False)
            self.seen_audio.index_fill_(0, idx, False)
        if text_hits or audio_hits:
            hits = self.upload(torch.tensor(text_hits + audio_hits, dtype=torch.long))
            t, a = hits[: len(text_hits)], hits[len(text_hits) :]
            if text_hits:
                self.seen_text.index_put_((t[:, 0], t[:, 1]), self.true)
            if audio_hits:
                self.seen_audio.index_put_((a[:, 0], a[:, 1]), self.true)

    def observe_ahead(self, previous: Samples) -> None:
        """Record the previous step's samples in the seen masks on the device, before the host has them:
        a step launched ahead samples with them counted. The same rule as `_observe` (a text-mode
        modality_pad counts as the audio channel's audio_pad), as read-modify-writes (slots are distinct
        rows), so that the host's later `_observe` of the same tokens changes nothing."""
        seqs, ids = previous.seqs, previous.ids
        text = [i for i, s in enumerate(seqs) if s.mode is Mode.TEXT]
        audio = [i for i, s in enumerate(seqs) if s.mode is Mode.AUDIO]
        slots = self.upload(torch.tensor([s.slot for s in seqs], dtype=torch.long))
        if text:
            rows = self.upload(torch.tensor(text, dtype=torch.long))
            slot, tok = slots[rows], ids[rows]
            is_pad = tok == self.cfg.modality_pad_token_id
            self.seen_text.index_put_((slot, tok), self.seen_text[slot, tok] | ~is_pad)
            pad = torch.full_like(tok, self.cfg.audio_pad_token_id)
            self.seen_audio.index_put_((slot, pad), self.seen_audio[slot, pad] | is_pad)
        if audio:
            rows = self.upload(torch.tensor(audio, dtype=torch.long))
            self.seen_audio.index_put_((slots[rows], ids[rows]), self.true)

    # ---- sampling ------------------------------------------------------------------------------
    def _settings(self, seqs: list[Sequence], ahead: int = 0) -> RowSettings:
        # One upload per dtype, a field per row (each field contiguous, as the fused kernels read them).
        floats = self.upload(torch.tensor([[s.sampling.temperature for s in seqs], [s.sampling.top_p for s in seqs],
                                           [s.sampling.repetition_penalty for s in seqs]], dtype=torch.float32))
        ints = self.upload(torch.tensor([[s.sampling.top_k for s in seqs], [s.noise_seed for s in seqs],
                                         [s.num_steps + ahead for s in seqs], [s.slot for s in seqs],
                                         [int(s.num_steps + ahead < s.sampling.min_new_tokens) for s in seqs]],
                                        dtype=torch.long))
        return RowSettings(*floats, *ints[:4], ints[4].bool())

    @staticmethod
    def _candidates(seqs: list[Sequence]) -> int | None:
        """TOPK_CAP when every non-greedy row's top_k fits well inside it (ties at the k-th value are
        kept, so leave room for them), else None: sort the whole vocabulary."""
        fits = all(s.sampling.temperature < GREEDY_BELOW or 0 < s.sampling.top_k <= TOPK_CAP // 2 for s in seqs)
        return TOPK_CAP if fits else None

    def _fused_candidates(self, seqs: list[Sequence], logits: torch.Tensor) -> int | None:
        """The candidate count when the fused kernels take this batch (CUDA, every row's top_k fits), else None."""
        k = self._candidates(seqs)
        if not self.fused or k is None or logits.shape[1] < k:
            return None
        return k

    def sample_text(self, seqs: list[Sequence], logits: torch.Tensor, ahead: int = 0):
        """logits [R, text_vocab] of sequences in text mode → (ids [R], ok [R]) on the device.
        ahead: 1 when the sequences' previous samples are not applied on the host yet."""
        rows = self._settings(seqs, ahead)
        logits = logits.float()
        if (k := self._fused_candidates(seqs, logits)) is not None:
            return self.fused(logits, self.seen_text, rows, TEXT_SALT, k)
        return sample_rows(logits, rows, self.seen_text[rows.slot], TEXT_SALT, self._candidates(seqs))

    def sample_audio(self, seqs: list[Sequence], logits: torch.Tensor, ahead: int = 0):
        """logits [R, audio_vocab] of sequences in audio mode → (ids [R], ok [R]) on the device.
        Ids at or above audio_logits_limit are masked, and eosp while a row is before min_new_tokens."""
        rows = self._settings(seqs, ahead)
        if (k := self._fused_candidates(seqs, logits)) is not None:
            return self.fused(logits.float(), self.seen_audio, rows, AUDIO_SALT, k,
                                     limit=self.cfg.audio_logits_limit, eosp=self.cfg.eosp_token_id)
        logits = logits.float().clone()
        logits[:, self.cfg.audio_logits_limit :] = float("-inf")
        eosp = logits[:, self.cfg.eosp_token_id]
        logits[:, self.cfg.eosp_token_id] = torch.where(rows.block_eosp, float("-inf"), eosp)
        return sample_rows(logits, rows, self.seen_audio[rows.slot], AUDIO_SALT, self._candidates(seqs))

    def launch(self, seqs: list[Sequence], text_logits: torch.Tensor, audio_logits: torch.Tensor,
               ahead: int = 0) -> Samples:
        """Sample the current head of each sequence, without waiting for anything. text_logits [T, V] hold
        the rows of the sequences in text mode, audio_logits [A, V_audio] those in audio mode, each in
        `seqs` order. ahead: 1 for a step launched before the previous one's samples reached the host
        (`observe_ahead` has recorded them on the device)."""
        self._observe(seqs)
        text_seqs = [s for s in seqs if s.mode is Mode.TEXT]
        audio_seqs = [s for s in seqs if s.mode is Mode.AUDIO]
        parts = []
        if text_seqs:
            parts.append(self.sample_text(text_seqs, text_logits, ahead))
        if audio_seqs:
            parts.append(self.sample_audio(audio_seqs, audio_logits, ahead))
        landing = self.landing[self.launches % len(self.landing)]
        self.launches += 1
        if not parts:
            empty = torch.zeros(0, dtype=torch.long, device=self.device)
            return Samples(seqs, empty, empty.bool(), landing)
        ids, ok = (torch.cat([p[i] for p in parts]) for i in (0, 1))
        order = text_seqs + audio_seqs
        if order != seqs:  # both modes in one step: back to batch order
            where = {s.seq_id: i for i, s in enumerate(order)}
            perm = self.upload(torch.tensor([where[s.seq_id] for s in seqs], dtype=torch.long))
            ids, ok = ids[perm], ok[perm]
        return Samples(seqs, ids, ok, landing)

    def __call__(self, seqs: list[Sequence], text_logits: torch.Tensor, audio_logits: torch.Tensor):
        """`launch` and wait: → [(token, ok)] per sequence."""
        return self.launch(seqs, text_logits, audio_logits).result()
