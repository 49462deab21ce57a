"""The llm engine: requests in, chunks of generated tokens out, one `step()` at a time.

Plain synchronous Python (no gRPC, asyncio or Prometheus here): the service drives `step()` from its
own thread (async_engine.py) and turns the `StepStats` each step records into metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tokenizers import Tokenizer

from services.common.errors import InvalidArgument
from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.block_manager import BlockManager
from services.llm.model import MossSpeechForCausalLM
from services.llm.model_runner import ModelRunner
from services.llm.prompt import PromptBuilder
from services.llm.sampler import Sampler
from services.llm.scheduler import Scheduler
from services.llm.sequence import Chunk, FinishReason, Sequence


@dataclass(frozen=True)
class EngineConfig:
    kv_cache_bytes: int = 1 << 30     # memory budget for the KV pool
    block_size: int = 16
    max_num_seqs: int = 8
    max_model_len: int = 4096         # prompt + generated positions
    max_new_tokens_limit: int = 2048


@dataclass
class GenerationRequest:
    request_id: str
    sampling: SamplingSettings
    chunking: ChunkSettings
    text: str | None = None                  # the user's turn, or …
    text_ids: list[int] | None = None        # … a formatted prompt (both channels)
    audio_ids: list[int] | None = None
    system_prompt: str = ""
    audio_reply: bool = True


@dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int
    blocks_used: int
    blocks_free: int


@dataclass
class StepStats:
    """What one step did, with monotonic timings in seconds."""

    duration: float = 0.0
    batch_size: int = 0
    prefill_tokens: int = 0
    token_intervals: list[float] = field(default_factory=list)  # per decode token: since the seq's last token
    prefill_durations: list[float] = field(default_factory=list)  # first token of a seq: since it was scheduled


class LLMEngine:
    def __init__(self, model: MossSpeechForCausalLM, tokenizer: Tokenizer, config: EngineConfig = EngineConfig()):
        self.cfg = model.cfg
        self.config = config
        self.tokenizer = tokenizer
        self.prompts = PromptBuilder(tokenizer, self.cfg)
        device = next(model.parameters()).device
        num_blocks = max(1, config.kv_cache_bytes // (config.block_size * self.cfg.kv_bytes_per_token))
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs)
        self.runner = ModelRunner(model, num_blocks, config.block_size, device)
        self.sampler = Sampler(self.cfg)
        self.sequences: dict[str, Sequence] = {}
        self.last_step = StepStats()

    # ---- requests --------------------------------------------------------------------------------
    def make_sequence(self, req: GenerationRequest) -> Sequence:
        """Validate a request and build its sequence. Pure: allocates nothing, safe from any thread."""
        if req.text is not None:
            if not req.text.strip():
                raise InvalidArgument("text", "must not be empty")
            prompt = self.prompts.build(req.text, req.audio_reply, req.system_prompt)
            text_ids, audio_ids = prompt.text_ids, prompt.audio_ids
        else:
            text_ids = list(req.text_ids or [])
            audio_ids = list(req.audio_ids or []) or [self.cfg.audio_pad_token_id] * len(text_ids)
            self._check_prompt_tokens(text_ids, audio_ids)
        self._check_length(len(text_ids), req.sampling.max_new_tokens)
        seq = Sequence(req.request_id, text_ids, audio_ids, req.sampling, req.chunking, req.audio_reply)
        seq.start_mode(self.cfg)
        return seq

    def _check_prompt_tokens(self, text_ids: list[int], audio_ids: list[int]) -> None:
        if not text_ids:
            raise InvalidArgument("tokens.text", "the prompt must not be empty")
        if len(audio_ids) != len(text_ids):
            raise InvalidArgument("tokens.audio", f"has {len(audio_ids)} ids, the text channel {len(text_ids)}")
        if not all(0 <= t < self.cfg.vocab_size for t in text_ids):
            raise InvalidArgument("tokens.text", f"ids must be in [0, {self.cfg.vocab_size})")
        if not all(0 <= a < self.cfg.audio_vocab_size for a in audio_ids):
            raise InvalidArgument("tokens.audio", f"ids must be in [0, {self.cfg.audio_vocab_size})")

    def _check_length(self, prompt_len: int, max_new: int) -> None:
        limit = min(self.config.max_model_len, self.block_manager.num_blocks * self.block_manager.block_size)
        if prompt_len + max_new > limit:
            raise InvalidArgument(
                "text",
                f"prompt of {prompt_len} tokens plus max_new_tokens {max_new} exceeds the context of {limit}",
            )

    def add(self, seq: Sequence) -> None:
        self.sequences[seq.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its blocks at once."""
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return False
        seq.finish(FinishReason.ABORTED)
        self.scheduler.finish(seq)
        return True

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def load(self) -> EngineLoad:
        bm = self.block_manager
        return EngineLoad(len(self.scheduler.running), len(self.scheduler.waiting), bm.num_used, bm.num_free)

    # ---- the loop --------------------------------------------------------------------------------
    def step(self) -> list[Chunk]:
        start = time.perf_counter()
        seqs = self.scheduler.schedule(start)
        prefill_tokens = sum(len(s) - s.num_cached for s in seqs)
        text_logits, audio_logits = self.runner.run(seqs)
        samples = self.sampler(seqs, text_logits, audio_logits)
        chunks = self.postprocess(seqs, samples, time.perf_counter())
        self.record(start, seqs, prefill_tokens)
        return chunks

    def postprocess(self, seqs: list[Sequence], samples, now: float) -> list[Chunk]:
        chunks, stats = [], StepStats()
        for seq, (text_token, audio_token) in zip(seqs, samples):
            if seq.first_token is None:
                stats.prefill_durations.append(now - seq.scheduled)
            else:
                stats.token_intervals.append(now - seq.last_token)
            seq.append_sampled(text_token, audio_token, self.cfg, now)
            chunk = seq.take_chunk()
            if chunk is not None:
                chunks.append(chunk)
            if seq.finished:
                self.scheduler.finish(seq)
                self.sequences.pop(seq.request_id, None)
        self.last_step = stats
        return chunks

    def record(self, start: float, seqs: list[Sequence], prefill_tokens: int) -> None:
        s = self.last_step
        s.duration = time.perf_counter() - start
        s.batch_size, s.prefill_tokens = len(seqs), prefill_tokens


def traced_generation(engine: LLMEngine, seq: Sequence) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Reference check: run `seq` alone to the end, keeping each step's logits (text [V], audio [V])."""
    engine.add(seq)
    logits = []
    while engine.has_work():
        engine.scheduler.schedule(time.perf_counter())
        text, audio = engine.runner.run([seq])
        logits.append((text[0].clone(), audio[0].clone()))
        engine.postprocess([seq], engine.sampler([seq], text, audio), time.perf_counter())
    return logits


def dense_logits(model: MossSpeechForCausalLM, text_ids: list[int], audio_ids: list[int]):
    """Reference: one dense forward over a whole sequence → all positions' logits (text, audio)."""
    device = next(model.parameters()).device
    t = torch.tensor(text_ids, device=device)
    a = torch.tensor(audio_ids, device=device)
    return model(t, a, torch.arange(len(text_ids), device=device))
