"""One request's generation state: both token channels, the modality state machine, chunking, timing.

Every position holds a pair (text token, audio token). Modes (docs/architecture.md §2):
- text mode: the text head's sample is the next text token; the audio channel input is audio_pad.
  Sampling sosp appends (sosp, audio_pad) and switches to audio mode.
- audio mode: the audio head's sample is the next code; the text channel input is modality_pad.
  Only ids below the codebook size are streamed as audio.
  Sampling eosp appends (modality_pad, eosp) and switches back to text mode (an audio reply ends there).
- a stop token on the text channel (<|endoftext|>, <|im_end|>) ends generation and is not appended.
"""

from __future__ import annotations

import enum
import itertools
import random
import time
from dataclasses import dataclass, field

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.model.config import MossSpeechConfig


class Mode(enum.Enum):
    TEXT = "text"
    AUDIO = "audio"


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.IntEnum):  # values match moss.speech.v1.FinishReason
    STOP = 1
    LENGTH = 2
    END_OF_SPEECH = 3
    ABORTED = 100  # never sent: an aborted request has no reader
    FAILED = 101   # never sent: the request ends with an error status


@dataclass
class GenerationStats:
    prompt_tokens: int
    generated_tokens: int
    audio_tokens: int
    text_tokens: int
    queue_seconds: float
    prefill_seconds: float
    decode_seconds: float
    first_audio_token_seconds: float
    finish_reason: FinishReason


@dataclass
class Chunk:
    seq_id: int       # the engine's own id: client request ids are for logs and need not be unique
    request_id: str
    index: int
    audio_tokens: list[int]
    text_tokens: list[int]
    final: bool
    stats: GenerationStats | None = None
    error: str | None = None  # set on a final chunk when this request alone failed (its stream ends INTERNAL)
    turn_tokens: tuple[list[int], list[int]] | None = None  # final chunk of a session's turn: what it added to the history
    since_arrival: float = 0.0  # seconds from the request's arrival to this chunk taken from the engine

    @property
    def first(self) -> bool:
        return self.index == 0


_ids = itertools.count()


@dataclass(eq=False)  # identity: queues find and remove *this* request, in O(1) per comparison
class Sequence:
    request_id: str
    text_ids: list[int]          # text channel, prompt then generated
    audio_ids: list[int]         # audio channel, position-aligned with text_ids
    sampling: SamplingSettings
    chunking: ChunkSettings
    audio_reply: bool
    mode: Mode = Mode.TEXT
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    finish_reason: FinishReason | None = None
    session_id: str = ""
    num_cached: int = 0          # positions whose K/V are in the cache
    text_kv_upto: int = 0        # positions whose text-branch K/V are too (the kernel runner may skip them while speaking)
    text_committed: int = 0      # text_kv_upto as the block manager last recorded it for this sequence's known blocks
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of the leading full, computed blocks
    num_steps: int = 0           # tokens sampled (each step samples both heads once)
    pending_audio: list[int] = field(default_factory=list)
    pending_text: list[int] = field(default_factory=list)
    num_audio: int = 0
    num_text: int = 0
    chunks_sent: int = 0
    window_sent: float | None = None  # when its first audio window (EngineConfig.first_audio_window tokens) was sent
    held: bool = False           # its listener stopped taking audio: parked, no steps, until released (scheduler.py)
    noise_seed: int = 0          # the sampler's noise key: the request's seed, or a random one
    slot: int | None = None      # the sampler's seen-token row while running
    seen_upto: int = 0           # positions already recorded in that row
    # Monotonic timestamps (time.perf_counter()).
    arrival: float = field(default_factory=time.perf_counter)
    scheduled: float | None = None
    first_token: float | None = None
    first_audio: float | None = None
    last_token: float | None = None

    def __post_init__(self):
        self.num_prompt = len(self.text_ids)
        self.history_len = 0     # positions of session history this turn's prompt begins with (its caller's)
        self.pin_at_end = bool(self.session_id)  # a session's turn: its blocks are pinned when it ends (pins.py)
        self.num_prefilled = 0   # prompt positions computed by this request (not served from the cache)
        # The sampler's noise is a hash of (noise_seed, step, token): a request's seed reproduces its
        # samples whatever else shares the batch; without one, a random key.
        # (A uint64 seed is kept as the int64 with the same bits.)
        seed = self.sampling.seed if self.sampling.seed is not None else random.getrandbits(64)
        self.noise_seed = seed - (1 << 64) if seed >= 1 << 63 else seed

    def __len__(self) -> int:
        return len(self.text_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def audio_sent(self) -> int:
        """Audio tokens sent in chunks."""
        return self.num_audio - len(self.pending_audio)

    def audio_lead(self, now: float, token_seconds: float) -> float | None:
        """Seconds of audio sent in chunks beyond what a listener who started at the first audio token has
        heard by `now` (the real listener starts later, after the vocoder: this is the lower bound);
        None unless the sequence is speaking."""
        if self.mode is not Mode.AUDIO or self.first_audio is None or self.finished:
            return None
        return self.audio_sent * token_seconds / self.chunking.playback_speed - (now - self.first_audio)

    def start_mode(self, cfg: MossSpeechConfig) -> None:
        """The first mode comes from the prompt's last position."""
        last_text, last_audio = self.text_ids[-1], self.audio_ids[-1]
        in_audio = last_text == cfg.sosp_token_id or (
            last_text == cfg.modality_pad_token_id and last_audio != cfg.eosp_token_id
        )
        self.mode = Mode.AUDIO if in_audio else Mode.TEXT

    # ---- the state machine ---------------------------------------------------------------------
    def append_sampled(self, token: int, cfg: MossSpeechConfig, now: float) -> None:
        """Apply one step's sample: the audio head's in audio mode, the text head's in text mode (each
        step samples only the head the current mode reads; the other's sample would be ignored)."""
        self.num_steps += 1
        self.first_token = self.first_token or now
        self.last_token = now
        if self.mode is Mode.AUDIO:
            self._push(cfg.modality_pad_token_id, token)
            if token == cfg.eosp_token_id:
                self.mode = Mode.TEXT
                if self.audio_reply:
                    return self.finish(FinishReason.END_OF_SPEECH)
            # The official mask leaves eosp + 1 sampleable; it is no codec code, so the model
            # sees it (as upstream) but the vocoder never gets it.
            elif token < cfg.audio_codebook_size:
                self.pending_audio.append(token)
                self.num_audio += 1
                self.first_audio = self.first_audio or now
        else:
            if token in cfg.stop_token_ids:
                return self.finish(FinishReason.STOP)
            self._push(token, cfg.audio_pad_token_id)
            if token == cfg.sosp_token_id:
                self.mode = Mode.AUDIO
            else:
                self.pending_text.append(token)
                self.num_text += 1
        if self.num_steps >= self.sampling.max_new_tokens:
            self.finish(FinishReason.LENGTH)

    def record_text_kv(self, start: int, n: int, computed: bool) -> None:
        """A step computed positions [start, start + n); `computed`: with the text branch. Text K/V are
        valid below text_kv_upto: a text branch computed over a gap attended to missing K/V, so it only
        counts when nothing before `start` is missing; a step without it invalidates any claim from
        `start` on (a position recomputed after a rollback may hold a different token)."""
        if computed and self.text_kv_upto >= start:
            self.text_kv_upto = start + n
        elif not computed:
            self.text_kv_upto = min(self.text_kv_upto, start)

    def _push(self, text_token: int, audio_token: int) -> None:
        self.text_ids.append(text_token)
        self.audio_ids.append(audio_token)

    def finish(self, reason: FinishReason) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason

    # ---- streaming -----------------------------------------------------------------------------
    def take_chunk(self) -> Chunk | None:
        """The next chunk by the request's policy, or None if not enough tokens are pending.

        The first chunk is due after `first_chunk_tokens` tokens, the second after `second_chunk_tokens`; each
        later one doubles the size before it, up to `chunk_tokens`; a finished sequence flushes everything in a
        final chunk. Why: chunk k must reach the listener before the audio of chunks 0..k-1 has played out. A
        small first chunk buys a low time to first audio but a thin buffer (its audio, less the vocoder's
        lookahead: 320 ms for the codec's first window of 8 tokens); a small second chunk comes within it (the
        codec's next block, 5 tokens), and doubling from there keeps each chunk's making time within what is
        already buffered, then settles at the size that is cheapest to vocode (docs/benchmarks.md).
        """
        pending = len(self.pending_audio) + len(self.pending_text)
        c = self.chunking
        doublings = min(max(self.chunks_sent - 1, 0), 16)
        due = min(c.chunk_tokens, c.second_chunk_tokens << doublings) if self.chunks_sent else c.first_chunk_tokens
        if not self.finished and pending < due:
            return None
        chunk = Chunk(self.seq_id, self.request_id, self.chunks_sent, self.pending_audio, self.pending_text, self.finished,
                      since_arrival=time.perf_counter() - self.arrival)
        if self.finished:
            chunk.stats = self.stats()
        self.pending_audio, self.pending_text = [], []
        self.chunks_sent += 1
        return chunk

    def stats(self) -> GenerationStats:
        scheduled = self.scheduled or self.arrival
        first = self.first_token or scheduled
        return GenerationStats(
            prompt_tokens=self.num_prompt,
            generated_tokens=self.num_steps,
            audio_tokens=self.num_audio,
            text_tokens=self.num_text,
            queue_seconds=scheduled - self.arrival,
            prefill_seconds=first - scheduled,
            decode_seconds=(self.last_token or first) - first,
            first_audio_token_seconds=(self.first_audio - self.arrival) if self.first_audio else 0.0,
            finish_reason=self.finish_reason or FinishReason.ABORTED,
        )
