"""The llm engine: requests in, chunks of generated tokens out, one `step()` at a time.

Plain synchronous Python (no gRPC, asyncio or Prometheus here): the service drives `step()` from its
own thread (async_engine.py) and turns the `StepStats` each step records into metrics (stats.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from tokenizers import Tokenizer

from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.sampling import ChunkSettings, SamplingSettings
from services.common.tensors import Uploader
from services.llm.batch import ScheduledBatch
from services.llm.engine.block_manager import BlockManager
from services.llm.engine.config import EngineConfig
from services.llm.engine.gpu_share import share_of
from services.llm.engine.pacing import hold_for
from services.llm.engine.pins import Pins
from services.llm.engine.runners import bytes_per_position, make_runner
from services.llm.engine.sampler import Sampler, Samples
from services.llm.engine.scheduler import Scheduler
from services.llm.engine.stats import EngineCounters, EngineLoad, StepStats
from services.llm.model.model import MossSpeechForCausalLM
from services.llm.model.prompt import PromptBuilder
from services.llm.sequence import Chunk, FinishReason, Mode, Sequence

log = logging.getLogger(__name__)


@dataclass
class GenerationRequest:
    request_id: str
    sampling: SamplingSettings
    chunking: ChunkSettings
    text: str | None = None                  # the user's turn, or …
    user_codes: list[int] | None = None      # … the user's spoken turn (audio codes), or …
    text_ids: list[int] | None = None        # … a formatted prompt (both channels)
    audio_ids: list[int] | None = None
    system_prompt: str = ""
    audio_reply: bool = True
    session_id: str = ""                     # a turn of this conversation: its blocks are pinned for the next (pins.py)
    # The session's history as its caller keeps it (both channels; None or empty: its first turn): the prompt is
    # the history, then this turn (without a system turn of its own).
    history_text_ids: list[int] | None = None
    history_audio_ids: list[int] | None = None


@dataclass(eq=False)
class InFlight:
    """A step launched on the device whose samples the host has not applied yet."""

    batch: ScheduledBatch
    seqs: list[Sequence]           # the sequences that sample, in batch order
    samples: Samples
    stats: StepStats
    start: float
    marks: tuple[int, int, int]
    modes: list[Mode]              # each sampling sequence's mode at launch: the head it samples
    void: set[int] = field(default_factory=set)  # seq_ids whose samples here are thrown away


class LLMEngine:
    def __init__(self, model: MossSpeechForCausalLM, tokenizer: Tokenizer, config: EngineConfig = EngineConfig(),
                 device: torch.device | None = None):
        """device: where the runner and sampler work (default: the model's; the trt runner's model has no weights)."""
        self.cfg = model.cfg
        self.config = config
        self.tokenizer = tokenizer
        self.prompts = PromptBuilder(tokenizer, self.cfg)
        self.turn_end = self.prompts.turn_end()
        if config.max_model_len > self.cfg.max_position_embeddings:
            raise ValueError(f"--max-model-len {config.max_model_len} is over the model's max_position_embeddings "
                             f"({self.cfg.max_position_embeddings}: the positions its RoPE was trained over)")
        device = device or next(model.parameters()).device
        num_blocks = max(1, config.kv_cache_bytes // (config.block_size * bytes_per_position(self.cfg, config, device)))
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.pins = Pins(self.block_manager, config.max_sessions)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   reclaim=self.pins.reclaim)
        self.upload = Uploader(device)  # one pinned staging buffer for the step's host → device copies
        self.runner = make_runner(model, num_blocks, device, config, self.upload)
        self.share = share_of(self.runner, config, device)  # the whole GPU or a share, step by step; before any step
        self.sampler = Sampler(self.cfg, config.max_num_seqs, device, self.upload)
        self.sequences: dict[int, Sequence] = {}  # by seq_id
        self.counters = EngineCounters()
        self.last_step = StepStats()
        self.inflight: InFlight | None = None  # launched, samples not applied (see `step`)
        self.last_done = time.perf_counter()
        self.on_logits = None  # optional observer (seqs, text logits, audio logits), for reference checks

    @property
    def context_limit(self) -> int:
        return min(self.config.max_model_len, self.block_manager.num_blocks * self.block_manager.block_size)

    # ---- requests --------------------------------------------------------------------------------
    def make_sequence(self, req: GenerationRequest) -> Sequence:
        """Validate a request and build its sequence: a session's history, then the turn. Pure: allocates
        nothing, safe from any thread."""
        history = list(req.history_text_ids or []), list(req.history_audio_ids or [])
        if history != ([], []):
            if not req.session_id:
                raise InvalidArgument("history", "needs a session_id")
            self._check_prompt_tokens(*history, field="history")
        if req.text is not None or req.user_codes is not None:
            if req.text is not None and not req.text.strip():
                raise InvalidArgument("text", "must not be empty")
            if req.user_codes is not None:
                self._check_codes(req.user_codes)
            user = req.text if req.text is not None else req.user_codes
            prompt = self.prompts.build(user, req.audio_reply, req.system_prompt)
            turn = prompt.turn_start if history[0] else 0  # a later turn: the history has the system turn
            text_ids, audio_ids = prompt.text_ids[turn:], prompt.audio_ids[turn:]
        else:
            text_ids = list(req.text_ids or [])
            audio_ids = list(req.audio_ids or []) or [self.cfg.audio_pad_token_id] * len(text_ids)
            self._check_prompt_tokens(text_ids, audio_ids)
        what = "session history plus this turn" if history[0] else "prompt"
        self._check_length(len(history[0]) + len(text_ids), req.sampling.max_new_tokens, what=what)
        seq = Sequence(req.request_id, history[0] + text_ids, history[1] + audio_ids, req.sampling, req.chunking,
                       req.audio_reply, session_id=req.session_id)
        seq.history_len = len(history[0])
        seq.start_mode(self.cfg)
        return seq

    def _check_prompt_tokens(self, text_ids: list[int], audio_ids: list[int], field: str = "tokens") -> None:
        if not text_ids:
            raise InvalidArgument(f"{field}.text", "the prompt must not be empty")
        if len(audio_ids) != len(text_ids):
            raise InvalidArgument(f"{field}.audio", f"has {len(audio_ids)} ids, the text channel {len(text_ids)}")
        if not all(0 <= t < self.cfg.vocab_size for t in text_ids):
            raise InvalidArgument(f"{field}.text", f"ids must be in [0, {self.cfg.vocab_size})")
        if not all(0 <= a < self.cfg.audio_vocab_size for a in audio_ids):
            raise InvalidArgument(f"{field}.audio", f"ids must be in [0, {self.cfg.audio_vocab_size})")

    def _check_codes(self, codes: list[int]) -> None:
        if not codes:
            raise InvalidArgument("audio.codes", "a spoken turn needs at least one code")
        if not all(0 <= c < self.cfg.audio_codebook_size for c in codes):
            bad = next(c for c in codes if not 0 <= c < self.cfg.audio_codebook_size)
            raise InvalidArgument("audio.codes", f"codes must be in [0, {self.cfg.audio_codebook_size}), got {bad}")

    def _check_length(self, prompt_len: int, max_new: int, what: str = "prompt") -> None:
        if prompt_len + max_new > self.context_limit:
            raise InvalidArgument(
                "text", f"{what} of {prompt_len} tokens plus max_new_tokens {max_new} exceeds the context of {self.context_limit}"
            )

    def add(self, seq: Sequence) -> None:
        """Queue a sequence (engine thread)."""
        self.sequences[seq.seq_id] = seq
        self.scheduler.add(seq)

    def abort(self, seq_id: int) -> bool:
        """Drop a sequence wherever it is and free its blocks at once."""
        seq = self.sequences.pop(seq_id, None)
        if seq is None:
            return False
        seq.finish(FinishReason.ABORTED)
        self.scheduler.finish(seq)
        self.sampler.release(seq)
        self.block_manager.free(seq)  # (a session's pin, if any, is the last finished turn's: kept)
        if self.inflight is not None and not any(self.sequences.get(s.seq_id) is s for s in self.inflight.batch.seqs):
            self.inflight = None  # nobody is left to apply the step in flight to (stream order keeps it harmless)
        return True

    def release_session(self, session_id: str) -> bool:
        """The session ended: its pinned blocks go back to the cache, and a turn of it still running pins none when
        it ends (its caller cancels it, but the cancel may come after this). False if nothing was pinned."""
        for seq in self.sequences.values():
            if seq.session_id == session_id:
                seq.pin_at_end = False
        return self.pins.release(session_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.inflight is not None

    def hold_seconds(self, now: float | None = None) -> float:
        """How long the next step may wait (0: step now). Pacing: while every running sequence is speaking
        with at least `max_audio_lead` seconds of audio sent ahead of its listener and nothing waits for
        admission, a step would only make audio that nobody hears for a while, and take GPU time from the
        vocoder, which shares the GPU and has audio due sooner. The wait ends when the first sequence's
        lead falls to the bound. Likewise for `first_audio_hold` seconds after a stream's first audio window
        was sent, while the vocoder makes its first audio (pacing.py). The driver (async_engine.py) waits;
        `step` itself never does."""
        if self.inflight is not None or self.scheduler.num_queued() or not self.scheduler.running:
            return 0.0
        return self._hold_for(self.scheduler.running, time.perf_counter() if now is None else now)

    def _hold_for(self, seqs: list[Sequence], now: float) -> float:
        c = self.config
        if not (stepping := [seq for seq in seqs if not seq.held]):
            return 0.0
        return hold_for(stepping, now, c.max_audio_lead, c.audio_token_seconds, c.first_audio_hold)

    def load(self) -> EngineLoad:
        bm, sched = self.block_manager, self.scheduler
        return EngineLoad(len(sched.running), sched.num_queued(), bm.num_used, bm.num_free, len(self.pins),
                          sum(seq.held for seq in sched.parked))

    def hold(self, request_id: str, held: bool) -> bool:
        """Hold a request, or release it, while its listener is not taking audio (the gateway asks: a client that
        stopped reading). Held, it takes no steps and no running place, and keeps its blocks unless the pool needs
        them (scheduler.py). Greedy or seeded, it says the same once released. False if no such request runs or
        waits."""
        for seq in self.sequences.values():
            if seq.request_id == request_id:
                if seq.held != held:
                    seq.held = held
                    (self.scheduler.hold if held else self.scheduler.release)(seq)
                return True
        return False

    # ---- the loop --------------------------------------------------------------------------------
    def step(self) -> list[Chunk]:
        """Apply one step's samples → the chunks they complete.

        Overlapped: while a decode step runs on the device, the next one is launched with the samples
        it will produce as its input ids (they never leave the device), assuming each sequence goes
        on in its mode; only then does the host wait for the first step's samples and apply them. So
        the host's work (applying samples, chunking, building the next step's inputs) runs while the
        GPU computes, and at batch 1 a step costs what the GPU takes. A sequence whose sample ended
        it or switched its mode had its next sample drawn from the wrong head: that sample is thrown
        away (its K/V position is right and is recomputed anyway), and the next step is scheduled
        normally. Prefill and mixed steps, and steps with requests waiting for admission, run one at
        a time."""
        try:
            if self.inflight is None:
                self.inflight = self._launch_scheduled()
                if self.inflight is None:
                    return []
            current = self.inflight
            self.inflight = self._launch_ahead(current)
            return self._complete(current, self.inflight)
        except Exception:
            self.inflight = None  # the caller fails every sequence; nothing may wait on this step
            raise

    def _launch_scheduled(self) -> InFlight | None:
        start, marks = time.perf_counter(), self._marks()
        self.upload.reset()
        batch = self.scheduler.schedule(start)
        for seq in self.scheduler.take_left():  # preempted or held: their sampler slots go to the sequences that run
            self.sampler.release(seq)
        self.sampler.assign(batch.seqs)
        if not batch.seqs:  # nothing runs, and the head of the queue did not fit the pool with every pin and parked
            if self.scheduler.waiting:  # sequence's blocks given up: unreachable (make_sequence checks), never spun on
                bm = self.block_manager
                raise ResourceExhausted(f"KV cache: the next request needs {bm.blocks_needed(len(self.scheduler.waiting[0]))} "
                                        f"blocks, {bm.num_free} of {bm.num_blocks} are free")
            return None
        return self._launch(batch, start, marks)

    def _launch_ahead(self, current: InFlight) -> InFlight | None:
        """Launch the decode step after `current` before its samples reach the host, when it is sure to
        be the same batch: every sequence sampled and is alive, none can end by length, nobody waits
        for admission, the pool has the blocks, and pacing would not hold it (judged before `current`'s
        samples land, which can only add lead: at worst one step more runs before a hold)."""
        seqs, bm = current.batch.seqs, self.block_manager
        if (not self.config.overlap or self.on_logits is not None or current.void or self.scheduler.num_queued()
                or len(current.seqs) != len(seqs) or any(seq.held for seq in seqs)
                or self._hold_for(seqs, time.perf_counter()) > 0):
            return None
        for seq in seqs:
            if self.sequences.get(seq.seq_id) is not seq or seq.num_steps + 1 >= seq.sampling.max_new_tokens:
                return None
        if sum(bm.blocks_needed(len(s) + 1) - len(s.block_table) for s in seqs) > bm.num_free:
            return None
        for seq in seqs:
            bm.append(seq, len(seq) + 1)  # the position the pending sample will take
        start, marks = time.perf_counter(), self._marks()
        self.upload.reset()
        self.counters.steps_ahead += 1
        return self._launch(ScheduledBatch(list(seqs), [1] * len(seqs)), start, marks, previous=current)

    def _launch(self, batch: ScheduledBatch, start: float, marks: tuple[int, int, int],
                previous: InFlight | None = None) -> InFlight:
        stats = self._count_tokens(batch, ahead=previous is not None)
        if self.share is not None:
            stats.place = self.share.select(max(len(batch.seqs), len(self.scheduler.running)), start)
        feed = None
        if previous is not None:
            self.sampler.observe_ahead(previous.samples)
            feed = self._feed(previous)
        if copies := self.block_manager.take_copies():  # partial blocks a sequence admitted now starts with
            self.runner.copy_blocks(copies)
        sampled, text_logits, audio_logits = self.runner.run(batch, feed)
        self.block_manager.commit(*batch.seqs)
        seqs = [batch.seqs[i] for i in sampled]
        if self.on_logits is not None:
            self.on_logits(seqs, text_logits, audio_logits)
        samples = self.sampler.launch(seqs, text_logits, audio_logits, ahead=int(previous is not None))
        return InFlight(batch, seqs, samples, stats, start, marks, [s.mode for s in seqs])

    def _feed(self, previous: InFlight) -> tuple[torch.Tensor, torch.Tensor]:
        """The next input ids [B] per channel from the previous step's samples, on the device: in text
        mode (sample, audio_pad), in audio mode (modality_pad, sample) — what `append_sampled` appends."""
        cfg, ids = self.cfg, previous.samples.ids
        in_audio = self.upload(torch.tensor([mode is Mode.AUDIO for mode in previous.modes]))
        return (torch.where(in_audio, cfg.modality_pad_token_id, ids), torch.where(in_audio, ids, cfg.audio_pad_token_id))

    def _complete(self, current: InFlight, ahead: InFlight | None) -> list[Chunk]:
        """Wait for `current`'s samples and apply them. The step launched ahead computed one more
        position per sequence: counted only for the sequences that go on in the mode it assumed."""
        results = current.samples.result()
        now = time.perf_counter()
        if ahead is not None:
            for seq in ahead.batch.seqs:
                seq.num_cached -= 1  # unconfirmed while this step's samples are applied (a session may end)
        live = [(seq, r) for seq, r in zip(current.seqs, results)
                if seq.seq_id not in current.void and self.sequences.get(seq.seq_id) is seq]
        chunks = self.postprocess([seq for seq, _ in live], [r for _, r in live], now, current.stats)
        if ahead is not None:
            for seq, mode in zip(ahead.seqs, ahead.modes):
                if self.sequences.get(seq.seq_id) is seq and seq.mode is mode:
                    seq.num_cached += 1
                else:
                    ahead.void.add(seq.seq_id)
                    self.counters.voided_samples += 1
        self.record(current.stats, current.start, len(current.batch.seqs), current.marks, now)
        return chunks

    def _marks(self) -> tuple[int, int, int]:
        return self.scheduler.num_preemptions, self.block_manager.hit_tokens, self.block_manager.queried_tokens

    def _count_tokens(self, batch: ScheduledBatch, ahead: bool = False) -> StepStats:
        stats = StepStats()
        for seq, n in zip(batch.seqs, batch.num_tokens):
            if ahead or (seq.num_cached == len(seq) - 1 and seq.num_steps):
                stats.decode_tokens += 1
            else:
                stats.prefill_tokens += n
                seq.num_prefilled += n
        return stats

    def postprocess(self, seqs: list[Sequence], samples: list[tuple[int, bool]], now: float, stats: StepStats) -> list[Chunk]:
        chunks = []
        for seq, (token, ok) in zip(seqs, samples):
            if not ok:  # this request's logits were not finite: it alone ends, the batch goes on
                chunks.append(self._fail(seq, "numerical fault: the model's logits for this request were not finite"))
                continue
            if seq.first_token is None:
                stats.prefill_durations.append(now - seq.scheduled)
            else:
                stats.token_intervals.append(now - seq.last_token)
            try:
                seq.append_sampled(token, self.cfg, now)
                chunk = seq.take_chunk()
            except Exception as exc:  # a bug that one request's state hit must not end the others
                log.exception("request %s failed in postprocess", seq.request_id)
                chunks.append(self._fail(seq, f"engine fault: {exc}"))
                continue
            if chunk is not None:
                chunks.append(chunk)
                window = self.config.first_audio_window
                if window and seq.window_sent is None and seq.audio_sent >= window:
                    seq.window_sent = now
            if seq.finished:
                turn_tokens = self._retire(seq)
                if chunk is not None:  # a finished sequence always flushes a final chunk
                    chunk.turn_tokens = turn_tokens
        self.last_step = stats
        return chunks

    def _fail(self, seq: Sequence, message: str) -> Chunk:
        self.abort(seq.seq_id)
        seq.finish_reason = FinishReason.FAILED
        return Chunk(seq.seq_id, seq.request_id, seq.chunks_sent, [], [], final=True, error=message)

    def _retire(self, seq: Sequence) -> tuple[list[int], list[int]] | None:
        """A finished sequence leaves the engine → for a session's turn, the positions it added to the history
        (its prompt after the history, its reply and the turn's closing), its blocks pinned for the next turn."""
        self.scheduler.finish(seq)
        self.sampler.release(seq)
        self.sequences.pop(seq.seq_id, None)
        if not seq.session_id:
            self.block_manager.free(seq)
            return None
        text, audio = self.turn_end
        if seq.mode is Mode.AUDIO:  # cut off mid-speech (length limit): close the segment first
            text, audio = [self.cfg.modality_pad_token_id, *text], [self.cfg.eosp_token_id, *audio]
        added = seq.text_ids[seq.history_len :] + text, seq.audio_ids[seq.history_len :] + audio
        if seq.pin_at_end:
            self.pins.keep(seq.session_id, seq)
        else:
            self.block_manager.free(seq)
        return added

    def record(self, stats: StepStats, start: float, batch_size: int, before: tuple[int, int, int], now: float) -> None:
        """stats.duration: from the step's launch, or the previous step's end if later (steps overlap)."""
        stats.duration = now - max(start, self.last_done)
        self.last_done = now
        stats.batch_size = batch_size
        stats.preemptions = self.scheduler.num_preemptions - before[0]
        stats.prefix_hit_tokens = self.block_manager.hit_tokens - before[1]
        stats.prefix_queried_tokens = self.block_manager.queried_tokens - before[2]
        self.counters.prefill_tokens += stats.prefill_tokens
        self.counters.decode_tokens += stats.decode_tokens
        self.counters.steps += 1
