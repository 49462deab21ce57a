"""The flow as the vocoder's token decoder: streams' tokens → mel, decoded in the reference's causal blocks,
many streams in one batch.

**Blocks** (the reference's streaming mode, `whisper_encoder_decoder.py` / `flow_inference.py`): a stream's
mel is decoded `block_tokens` tokens at a time, once the `pre_lookahead_len` tokens after the block have
arrived too (the encoder reads them, its look-ahead context). The first block takes a few more tokens so that
prompt and first block end on a whole attention chunk. Each decode runs the flow in streaming mode
(static-chunk attention) over the voice's prompt and at most `max_context_tokens` of the stream's latest
tokens (the block and its look-ahead included) and keeps the new block's frames. At the stream's end the
tokens left over are decoded without look-ahead. With the whole stream as context this equals decoding it
offline in streaming mode (block-causal): tests/test_codec_stream.py.

Two differences from the reference, both once a stream is longer than max_context_tokens: a frame takes the
flow's noise of its place in the stream, not of its place in the window (the reference's window sliding past
the stream's start gives every frame new noise: streamed vs offline mel 3 dB on the tiny preset, 59 dB this
way); and when a chunk brings several blocks at once they are decoded together in one window (the reference
decodes them one call each), so the earlier of them may see up to a block less left context.

**Batching**: the rows of a call (one per stream with a block due) are padded to a token bucket; padding
never reaches a row's kept frames (conformer.py, estimator.py). On CUDA each (batch bucket, token bucket)
call is a CUDA graph (the encoder and all Euler steps: flow_graphs.py), captured by `warm_up` before serving.

**The prompt's prefix** (prefix.py): the voices' prompts begin every row, and their first whole chunks are the
same in every call; `set_voices` computes them once, and calls of `prefix_min_rows` rows or more whose voices are
all known solve only the frames after them (at the real size, 180 of a saturated row's 320 frames). Smaller
calls solve every frame: they are bound by the latency of their kernels, not their work (H100: 16 rows 78 -> 58 ms
with the prefix, 4 rows 35 -> 32 ms, 1 row 26 -> 27 ms; docs/benchmarks.md).

**A stream's own frames, solved once** (history.py): a stream started with `start` takes a slot of the stream
history at its first call (while one is free, and when its blocks are whole attention chunks), and from then on a
call solves only its new frames, reading the ones it solved before from the history; the encoder still reads the
window of tokens. Such a row solves at most `solve_cap` frames per flow call (the solve buckets' largest); a chunk
that brings more is decoded in several calls, block by block as the reference does. Its slot is freed with its
last block, or by `release` when the stream is cancelled. A stream with no slot is decoded over the window as above.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools

import torch

from services.common.memory import Pool, size_pool
from services.settings import GPU_STACK_STREAMS
from services.vocoder.capture import GraphShape
from services.vocoder.codec.encoder_state import EncoderRows, EncoderStore
from services.vocoder.codec.flow import CausalMaskedDiffWithXvec, FlowBatch
from services.vocoder.codec.flow_graphs import FlowGraphs, on_device
from services.vocoder.codec.flow_state import FlowState, Plan
from services.vocoder.codec.history import DEFAULT_RING_FRAMES, HistoryRows, StreamHistory
from services.vocoder.codec.prefix import PromptPrefix
from services.vocoder.codec.voice import Voice
from services.vocoder.runner import smallest
from services.vocoder.token_decoder import TokenFormat

TOKEN_BUCKETS = (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)   # prompt + window tokens of a row
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32)  # a padding row costs a row: steps of 2-4
DEFAULT_BLOCK_TOKENS = 5
DEFAULT_MAX_CONTEXT_TOKENS = 40
PREFIX_MIN_ROWS = 4  # measured: 1 row slower with the prefix, 4 and 16 faster; 2 and 3 not measured
SOLVE_BLOCKS = 4     # a history row's frames per call, at most: the gateway's chunks of 20 tokens (4 blocks)
DEFAULT_HISTORY_STREAMS = GPU_STACK_STREAMS  # streams that hold a history slot (memory: history.py)
HISTORY_POOL = Pool("vocoder", "the flow's stream history", "--flow-history-streams", "streams")


class FlowTokenDecoder:
    def __init__(self, flow: CausalMaskedDiffWithXvec, device: torch.device, dtype: torch.dtype | None = None,
                 block_tokens: int = DEFAULT_BLOCK_TOKENS, max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
                 n_timesteps: int | None = None, cfg_rate: float | None = None, graphs: bool | None = None,
                 prefix_min_rows: int = PREFIX_MIN_ROWS, history_streams: int | None = DEFAULT_HISTORY_STREAMS,
                 history_frames: int = DEFAULT_RING_FRAMES, encoder_window: int = 0):
        """history_streams: streams whose solved frames are kept (history.py; 0: none; None: as many as fit in the
        device's free memory, up to DEFAULT_HISTORY_STREAMS: services/common/memory.py). encoder_window: with a
        history, each slot keeps its encoder state too and a call runs the encoder over its new tokens only, reading
        this many kept positions before them (encoder_state.py); 0: the encoder runs over prompt + window."""
        cfg = flow.cfg
        if block_tokens < 1:
            raise ValueError(f"flow decoder: block_tokens must be >= 1, got {block_tokens}")
        if max_context_tokens < block_tokens + cfg.pre_lookahead_len:
            raise ValueError(f"flow decoder: max_context_tokens ({max_context_tokens}) must hold a block and its "
                             f"look-ahead ({block_tokens} + {cfg.pre_lookahead_len})")
        cuda = device.type == "cuda"
        self.device, self.dtype = device, dtype or (torch.bfloat16 if cuda else torch.float32)
        self.flow = flow.to(device=device, dtype=self.dtype).eval()
        if n_timesteps is not None:
            self.flow.decoder.n_timesteps = n_timesteps
        if cfg_rate is not None:
            self.flow.decoder.cfg_rate = cfg_rate
        self.block, self.max_context, self.lookahead = block_tokens, max_context_tokens, cfg.pre_lookahead_len
        self.ratio = cfg.token_mel_ratio
        self.cfg = TokenFormat(codebook_size=cfg.vocab_size, frames_per_token=cfg.token_mel_ratio,
                               num_mels=cfg.output_size, sampling_rate=cfg.sampling_rate, hop_size=cfg.hop_size)
        self.use_graphs = cuda if graphs is None else graphs
        self.graphs = self._new_graphs()
        self.prefix: PromptPrefix | None = None
        self.prefix_min_rows = prefix_min_rows
        if (history_streams is not None and history_streams < 0) or history_frames < 1:
            raise ValueError(f"flow decoder: history_streams ({history_streams}) must be >= 0 and history_frames "
                             f"({history_frames}) >= 1")
        self.history_streams, self.history_frames = history_streams, history_frames
        self.encoder_window = encoder_window
        self.history: StreamHistory | None = None
        self.solve_cap = SOLVE_BLOCKS * block_tokens * self.ratio
        self.ids = itertools.count()

    def set_voices(self, voices: list[Voice], capacity: int | None = None) -> None:
        """The voices streams will speak in: their prompts' common prefix is solved now, once (prefix.py), with places
        for `capacity` voices in all (default: these; more: `add_voice` while serving)."""
        # The prefix's places, then the history sized from them against the memory left (a history that cannot fit
        # is refused here, before the voices' prompts run through the flow), then the prompts recorded.
        prefix = PromptPrefix(self.flow, voices, capacity, record=False)
        chunk = self.flow.cfg.estimator.static_chunk_size
        keeps_history = bool(prefix) and self.history_streams != 0 and (self.block * self.ratio) % chunk == 0
        streams = self._history_slots(prefix) if keeps_history else 0
        prefix.record(self.flow)
        self.prefix = prefix if prefix else None
        self.graphs = self._new_graphs()  # graphs read the prefix's tensors: captured again
        self.history = None
        if keeps_history:
            # A history row's first call solves the prompt's frames after the prefix and its first block: the cap
            # holds them, in whole blocks' frames.
            frames = self.block * self.ratio
            first = max(len(v.prompt_tokens) * self.ratio - prefix.frames + self.first_block(v) * self.ratio
                        for v in voices)
            first = -(-first // frames) * frames
            self.solve_cap = max(self.solve_cap, first)
            if not streams:  # (no room for one: every stream decodes over its window)
                return
            estimator = self.flow.decoder.estimator
            self.history = StreamHistory(estimator, prefix, streams, self.history_frames)
            if self.encoder_window:
                self.history.encoder = EncoderStore(self.flow.encoder, streams, self.encoder_window + TOKEN_BUCKETS[-1],
                                                    self.encoder_window, self.device, self.dtype)
            # A history call's graphs: its rows padded to a first call's frames or the cap, their windows to a
            # first call's tokens or a whole window. Few graphs: each takes ~1 s to capture at the real size, and
            # the vocoder captures every one before it serves.
            self.solve_buckets = tuple(sorted({first, self.solve_cap}))
            prompts = [len(v.prompt_tokens) for v in voices]
            # (with the encoder's state kept, a later call's row holds only its new tokens: at most the cap's)
            later = self.solve_cap // self.ratio + self.lookahead if self.encoder_window else max(prompts) + self.max_context
            self.history_token_buckets = tuple(sorted({
                smallest(TOKEN_BUCKETS, max(prompts) + max(self.first_block(v) for v in voices) + self.lookahead)
                or TOKEN_BUCKETS[-1], smallest(TOKEN_BUCKETS, later) or TOKEN_BUCKETS[-1]}))

    def _history_slots(self, prefix: PromptPrefix) -> int:
        """Streams the history keeps: as asked, or as many as the memory holds (0: none fits; services/common/memory.py,
        which refuses a count given that does not fit)."""
        per_stream = StreamHistory.bytes_per_stream(self.flow.decoder.estimator, prefix, self.history_frames)
        if self.encoder_window:
            per_stream += EncoderStore.bytes_per_slot(self.flow.encoder, self.encoder_window + TOKEN_BUCKETS[-1],
                                                      next(self.flow.parameters()).element_size())
        return size_pool(HISTORY_POOL, per_stream, self.history_streams, DEFAULT_HISTORY_STREAMS, self.device, least=0)

    @property
    def tokens_per_second(self) -> float:
        return self.cfg.sampling_rate / self.cfg.hop_size / self.ratio

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt whose calls fit the token buckets (with a whole context window): a voice with a longer
        one has every call eager."""
        return TOKEN_BUCKETS[-1] - self.max_context

    def add_voice(self, voice: Voice) -> bool:
        """A voice for streams started from now on, while others play → whether its streams read the prompt prefix
        and keep a stream history (prefix.py: a free place, and a prompt as long as the prefix); else they are decoded
        over their window, as any voice outside the prefix. Nothing is captured again and no stream's history is
        touched: its prefix goes to a place kept for it. (The caller keeps calls on other threads that might capture a
        graph away meanwhile: capture.py's gate.) Its calls replay the graphs captured for the voices at the start
        where its prompt fits their token buckets, and run eagerly where not."""
        copies = (self.history.copy_voice,) if self.history is not None else ()
        return self.prefix is not None and self.prefix.add(self.flow, voice, copies)

    def remove_voice(self, voice: Voice) -> None:
        """No stream starts in the voice from now on (the caller sees to it): its place in the prompt prefix is free
        for `add_voice` once its streams playing have all ended (prefix.py's retire)."""
        if self.prefix is not None:
            self.prefix.retire(voice)

    # ---- streams ---------------------------------------------------------------------------------
    def start(self, voice: Voice) -> FlowState:
        state = FlowState(voice, stream=next(self.ids))
        if self.prefix is not None:
            self.prefix.opened(state.stream, voice)
        return state

    def lane(self) -> "FlowTokenDecoder":
        """The same decoder for a second worker thread: the flow, voices and stream history shared, graphs of its
        own (two threads never replay graphs of one memory pool at once; worker.py)."""
        other = copy.copy(self)
        other.graphs = other._new_graphs()
        return other

    def _new_graphs(self) -> FlowGraphs:
        return FlowGraphs(self.flow, self.device, self.dtype, self.ratio, self.cfg.num_mels)

    def release(self, state: FlowState) -> None:
        """The stream is gone (ended, cancelled, or failed): its history slot is freed once no call writes it, and it
        plays its voice no more (any thread; more than once is as once)."""
        if self.history is not None and state.stream is not None:
            self.history.release(state.stream)
        if self.prefix is not None and state.stream is not None:
            self.prefix.closed(state.stream)

    def first_block(self, voice: Voice) -> int:
        """The reference's first hop: the block, plus the tokens that end prompt + block on a multiple of it."""
        return self.block + (-len(voice.prompt_tokens)) % self.block

    def plan(self, state: FlowState, received: int, final: bool, capped: bool = False) -> Plan | None:
        """The row that decodes what is due with `received` tokens (final: the stream has ended); None: nothing.
        capped: a history row's, at most solve_cap frames (the rest is due in the next call)."""
        done = state.decoded
        first = self.first_block(state.voice) if done == 0 else self.block
        if final:
            if received <= done:
                return None
            decode_end = end = received
        else:
            if received - done < first + self.lookahead:
                return None
            blocks = 1 + (received - done - first - self.lookahead) // self.block
            decode_end = done + first + (blocks - 1) * self.block
            end = decode_end + self.lookahead
        if capped:
            room = (self.solve_cap - self._tail_frames(state)) // self.ratio    # tokens this call may solve
            most = first + max(0, room - first) // self.block * self.block
            if decode_end - done > most:
                decode_end = done + most
                end = min(received, decode_end + self.lookahead)
        start = max(0, min(done, end - self.max_context))
        return Plan(start, decode_end, end, done)

    def _tail_frames(self, state: FlowState) -> int:
        """The prompt's frames after the prefix, which a history row's first call solves before its tokens'."""
        return len(state.voice.prompt_tokens) * self.ratio - self.prefix.frames if state.written == 0 else 0

    @property
    def end_tokens(self) -> int:
        """The most tokens a stream's end still decodes, once its first block is out: a block is decoded as soon as
        the look-ahead after it is in, so fewer than a block and its look-ahead are left."""
        return self.block + self.lookahead - 1

    def pending_frames(self, state: FlowState, new_tokens: int | None) -> int:
        plan = self.plan(state, state.received + (new_tokens or 0), new_tokens is None)
        return 0 if plan is None else (plan.decode_end - plan.emit_from) * self.ratio

    # ---- decoding --------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode_chunks(self, chunks: list[tuple[list[int] | None, FlowState]]) -> list[tuple[torch.Tensor, FlowState]]:
        """[(a stream's new tokens, or None at its end; its state)] → [(mel [80, n] float32, its next state)]:
        n = 0 until a block is due. Every due row in one batched flow call (padded rows never mix): one for the
        rows with a history slot, one for the others; more for history rows with more frames due than a call holds."""
        streams = [state.stream for _, state in chunks if state.stream is not None]
        if self.history is None:
            return self._decode_chunks(chunks)
        self.history.begin(streams)
        try:
            return self._decode_chunks(chunks)
        finally:
            done = None
            if self.device.type == "cuda":  # the slots it wrote are busy until the device has run the call
                done = torch.cuda.Event()
                done.record()
            self.history.end(streams, done)

    def _decode_chunks(self, chunks):
        states = [self.extend(state, tokens) for tokens, state in chunks]
        finals = [tokens is None for tokens, _ in chunks]
        pieces: list[list[torch.Tensor]] = [[] for _ in chunks]
        todo = list(range(len(chunks)))
        while todo:
            kept, window = [], []
            for i in todo:
                if (row := self.next_row(states[i], finals[i])) is not None:
                    states[i], plan, in_history = row
                    (kept if in_history else window).append((i, plan))
            for group, run in ((kept, self._run_history), (window, self._run)):
                if group:
                    mels = run([(states[i], plan) for i, plan in group])
                    for (i, plan), mel in zip(group, mels):
                        pieces[i].append(mel)
                        states[i] = self.advance(states[i], plan)
            todo = [i for i, _ in kept]  # a capped row may have more due
        return [self.finish(state, pieces[i], finals[i]) for i, state in enumerate(states)]

    # ---- a stream's rows, one at a time (decode_chunks above; the solve's worker, solve_worker.py) ---------------
    @staticmethod
    def extend(state: FlowState, tokens: list[int] | None) -> FlowState:
        """The state with a chunk's new tokens received (None, the end: none)."""
        return dataclasses.replace(state, tokens=state.tokens + tuple(tokens)) if tokens else state

    def next_row(self, state: FlowState, final: bool) -> tuple[FlowState, Plan, bool] | None:
        """The row that decodes what is due next → (the state, its history slot assigned at its first row; the plan,
        capped for a history row; whether it is a history row), or None when nothing is due."""
        if self.plan(state, state.received, final) is None:
            return None
        state = self._assign(state)
        in_history = state.slot is not None and state.slot >= 0
        return state, self.plan(state, state.received, final, capped=in_history), in_history

    def finish(self, state: FlowState, pieces: list[torch.Tensor], final: bool) -> tuple[torch.Tensor, FlowState]:
        """A chunk's rows all decoded → (its mel [80, n], the state); at the stream's end its history slot is let go
        (freed once no call writes it)."""
        if final and self.history is not None and state.stream is not None:
            self.history.release(state.stream)
        mel = torch.cat(pieces, 1) if pieces else torch.zeros(self.cfg.num_mels, 0, device=self.device)
        return mel, state

    def _assign(self, state: FlowState) -> FlowState:
        """A stream's history slot at its first call (-1: none; or none kept: its slot was released)."""
        if state.slot is None:
            usable = (self.history is not None and state.stream is not None and state.decoded == 0
                      and self.prefix.covers([state.voice]))
            slot = self.history.acquire(state.stream) if usable else None
            return dataclasses.replace(state, slot=-1 if slot is None else slot)
        if state.slot >= 0 and not (self.history is not None and self.history.holds(state.stream, state.slot)):
            return dataclasses.replace(state, slot=-1)
        return state

    def advance(self, state: FlowState, plan: Plan) -> FlowState:
        """The state after its row `plan` was decoded."""
        keep = max(0, plan.decode_end - self.max_context)  # no later window starts before this
        state = dataclasses.replace(state, tokens=tuple(state.window(keep, state.received)), base=keep,
                                    decoded=plan.decode_end)
        if state.slot is not None and state.slot >= 0:
            solved = self._tail_frames(state) + (plan.decode_end - plan.emit_from) * self.ratio
            state = dataclasses.replace(state, written=state.written + solved, bank=0 if state.bank < 0 else 1 - state.bank)
        return state

    def _run(self, rows: list[tuple[FlowState, Plan]]) -> list[torch.Tensor]:
        """Rows → each row's kept frames, mel [80, n] float32, on the device."""
        lengths = [len(s.voice.prompt_tokens) + p.end - p.start for s, p in rows]
        longest = max(lengths)
        voices = [s.voice for s, _ in rows]
        graph = self.use_graphs and smallest(TOKEN_BUCKETS, longest) is not None and len(rows) <= BATCH_BUCKETS[-1]
        if graph:  # (padded to its buckets or a graph that holds them, else eagerly: FlowGraphs.pick)
            graph = self.graphs.pick(smallest(BATCH_BUCKETS, len(rows)), smallest(TOKEN_BUCKETS, longest),
                                     lambda b: self._prefixed(b, voices))
        B, T = graph[:2] if graph else (len(rows), longest)
        prefixed = self._prefixed(B, voices)
        batch = self._batch(rows, B, T, prefixed)
        if graph:
            mel = self.graphs.replay(batch, B, T, self.prefix if prefixed else None)
        else:
            mel = self.flow(batch, streaming=True, prefix=self.prefix if prefixed else None)
        skipped = self.prefix.frames if prefixed else 0  # the mel starts after the prompt's prefix
        out = []
        for row, (state, plan) in enumerate(rows):
            prompt = len(state.voice.prompt_tokens)
            a, b = (prompt + plan.emit_from - plan.start) * self.ratio, (prompt + plan.decode_end - plan.start) * self.ratio
            out.append(mel[row, :, a - skipped : b - skipped].float().clone())  # a copy: a replay overwrites it
        return out

    def _run_history(self, rows: list[tuple[FlowState, Plan]]) -> list[torch.Tensor]:
        """History rows → each row's new frames, mel [80, n] float32, on the device: the call solves those only."""
        lengths = [self.history_row_tokens(s, p) for s, p in rows]
        spans = [self._solved(s, p) for s, p in rows]
        longest, most = max(lengths), max(b - a for a, b, _ in spans)
        T, N = smallest(self.history_token_buckets, longest), smallest(self.solve_buckets, most)
        B = smallest(BATCH_BUCKETS, len(rows))
        graph = self.use_graphs and None not in (T, N, B) and self.graphs.pick(B, T, lambda b: True, N)
        B, T, N = graph if graph else (len(rows), longest, most)
        batch = self.history_batch(rows, B, T, N)
        if graph:
            mel = self.graphs.replay(batch, B, T, self.history, N, self.history.scratch)
        else:
            mel = self.flow(batch, streaming=True, prefix=self.history)
        return [mel[row, :, skip : b - a].float().clone() for row, (a, b, skip) in enumerate(spans)]

    def _kept_positions(self, state: FlowState) -> int:
        """The row positions (prompt, then stream) whose encoder state a history row's slot keeps: 0 before its first
        call or without the encoder's state, else the prompt and the stream's decoded tokens."""
        if self.history.encoder is None or state.written == 0:
            return 0
        return len(state.voice.prompt_tokens) + state.decoded

    def history_row_tokens(self, state: FlowState, plan: Plan) -> int:
        """A history row's tokens: its prompt and window, or, with the encoder's state kept, its positions after those
        kept (the history's token buckets hold them)."""
        kept = self._kept_positions(state)
        return len(state.voice.prompt_tokens) + plan.end - (kept or plan.start)

    def history_batch(self, rows: list[tuple[FlowState, Plan]], B: int, T: int, N: int) -> FlowBatch:
        """History rows padded to [B, T] tokens, N solved frames each, with their places in the history, on the
        device."""
        batch = self._batch(rows, B, T, prefixed=True, kept_encoder=self.history.encoder is not None)
        # (the solved frames in the batch row's: with the encoder's state kept, a later call's row starts at its kept
        # positions, where its window's stream part starts at plan.start)
        shifts = [(p.start - kept) * self.ratio if (kept := self._kept_positions(s)) else 0 for s, p in rows]
        spans = [(a + shift, b + shift) for (a, b, _), shift in zip((self._solved(s, p) for s, p in rows), shifts)]
        index = torch.zeros(B, N, dtype=torch.long)
        frames = torch.zeros(B, dtype=torch.long)
        slot, count, at = torch.full((B,), self.history.scratch), torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
        bank, keep_bank = torch.full((B,), -1), torch.zeros(B, dtype=torch.long)
        for row, ((state, _), (a, b)) in enumerate(zip(rows, spans)):
            index[row, : b - a] = torch.arange(a, b)
            frames[row], slot[row] = b - a, state.slot
            count[row], at[row] = min(state.written, self.history.ring), state.written % self.history.ring
            bank[row], keep_bank[row] = state.bank, 0 if state.bank < 0 else 1 - state.bank
        to = dict(device=self.device)
        batch.solve_index, batch.solve_frames = on_device(index, **to), on_device(frames, **to)
        batch.history = HistoryRows(*(on_device(t, **to) for t in (slot, count, at, bank, keep_bank)))
        return batch

    def _solved(self, state: FlowState, plan: Plan) -> tuple[int, int, int]:
        """A history row's solved frames [a, b) in its window's frames, and how many of them are the prompt's
        (its first call: those after the prefix, solved for the stream's later frames, not returned)."""
        prompt = len(state.voice.prompt_tokens)
        tail = self._tail_frames(state)
        a = (prompt + plan.emit_from - plan.start) * self.ratio - tail
        return a, (prompt + plan.decode_end - plan.start) * self.ratio, tail

    def _prefixed(self, B: int, voices) -> bool:
        """Whether a call of B rows (its batch bucket) in these voices reads the prompt prefix."""
        return self.prefix is not None and B >= self.prefix_min_rows and self.prefix.covers(voices)

    def _batch(self, rows: list[tuple[FlowState, Plan]], B: int, T: int, prefixed: bool = False,
               kept_encoder: bool = False) -> FlowBatch:
        """Rows padded to [B, T] (padding rows: one token of code 0, no prompt, the first voice's prefix) on the
        device. kept_encoder: history rows whose encoder state is kept; each holds its positions after those kept (at
        its first call its prompt's, then its tokens'; then the look-ahead context), with its place in the encoder's
        store (a padding row: the scratch slot, nothing made final), and `lengths` counts its row from the prompt's
        start."""
        tokens = torch.zeros(B, T, dtype=torch.long)
        lengths, context = torch.ones(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
        prompt_mel = torch.zeros(B, T * self.ratio, self.cfg.num_mels)
        prompt_frames = torch.zeros(B, dtype=torch.long)
        embedding = torch.zeros(B, rows[0][0].voice.embedding.shape[0])
        noise_shift, voice_index = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
        slot, done = torch.full((B,), self.history.scratch if kept_encoder else 0), torch.zeros(B, dtype=torch.long)
        for row, (state, plan) in enumerate(rows):
            voice = state.voice
            prompt = len(voice.prompt_tokens)
            kept = self._kept_positions(state) if kept_encoder else 0
            start = kept - prompt if kept else plan.start        # the stream's first token in the row
            seq = torch.tensor(state.window(start, plan.end), dtype=torch.long)
            seq = seq if kept else torch.cat([voice.prompt_tokens, seq])
            tokens[row, : len(seq)] = seq
            lengths[row] = prompt + plan.decode_end - (0 if kept_encoder else plan.start)
            context[row] = plan.end - plan.decode_end
            frames = min(voice.prompt_frames, T * self.ratio)  # (a kept row's later calls hold no prompt frame)
            prompt_mel[row, :frames] = voice.prompt_mel[:frames]
            prompt_frames[row] = voice.prompt_frames
            embedding[row] = voice.embedding
            noise_shift[row] = 0 if kept_encoder else plan.start * self.ratio
            if prefixed:
                voice_index[row] = self.prefix.voice_index(voice)
            if kept_encoder:
                slot[row], done[row] = state.slot, kept
        to = dict(device=self.device)
        batch = FlowBatch(on_device(tokens, **to), on_device(lengths, **to), on_device(context, **to),
                          on_device(prompt_mel, dtype=self.dtype, **to), on_device(prompt_frames, **to),
                          on_device(embedding, dtype=self.dtype, **to), on_device(noise_shift, **to),
                          on_device(voice_index, **to))
        if kept_encoder:  # (the positions made final: those decoded less those kept)
            batch.encoder_rows = EncoderRows(*(on_device(t, **to) for t in (slot, done, lengths - done)))
        return batch

    @torch.inference_mode()
    def warm_up(self, voices: list[Voice], max_batch: int, first_calls: bool = False) -> None:
        """Capture the graphs every call can need: batch buckets up to max_batch; token buckets from the
        shortest voice's first block to the longest voice's prompt with a whole context window (with a stream
        history: its two token buckets and two frame buckets, history calls only). first_calls: only those of
        streams' first calls (a worker lane of first chunks: worker.py)."""
        for shape in self.shapes(voices, max_batch, first_calls):
            shape.capture()

    def shapes(self, voices: list[Voice], max_batch: int, first_calls: bool = False) -> list[GraphShape]:
        """The graphs warm_up captures, not captured yet (capture.py captures them; none without graphs)."""
        if not self.use_graphs:
            return []
        shapes: list[GraphShape] = []
        prompts = [len(v.prompt_tokens) for v in voices]
        low = smallest(TOKEN_BUCKETS, min(prompts) + self.block + self.lookahead) or TOKEN_BUCKETS[-1]
        high = smallest(TOKEN_BUCKETS, max(prompts) + self.max_context) or TOKEN_BUCKETS[-1]
        if self.history is not None:
            low, high = min(low, *self.history_token_buckets), max(high, *self.history_token_buckets)
        ceiling = smallest(BATCH_BUCKETS, max_batch) or BATCH_BUCKETS[-1]
        for B in (b for b in BATCH_BUCKETS if b <= ceiling):
            for T in (t for t in TOKEN_BUCKETS if low <= t <= high):
                if self.history is None:
                    prefix = self.prefix if self._prefixed(B, voices) else None
                    shapes.append(GraphShape(B, lambda B=B, T=T, prefix=prefix: self.graphs.capture(B, T, prefix),
                                             (id(self.graphs), (B, T, prefix is not None, None))))
                    continue
                # With a history every stream decodes through it while slots last; a window call after that (the
                # streams beyond history_streams) runs eagerly once serving (flow_graphs.py).
                if T not in self.history_token_buckets or (first_calls and T != self.history_token_buckets[0]):
                    continue
                for N in self.solve_buckets[:1] if first_calls else self.solve_buckets:
                    shapes.append(GraphShape(B, lambda B=B, T=T, N=N: self.graphs.capture(
                        B, T, self.history, N, self.history.scratch), (id(self.graphs), (B, T, True, N))))
        # The cover: the most rows, tokens and frames solved, which holds every call of this plan (capture.py); for
        # window calls, whether a call reads the prefix depends on its rows, and the largest call decides it.
        largest = max(shapes, key=lambda s: (s.key[1][0], s.key[1][1], s.key[1][3] or 0), default=None)
        return [s._replace(cover=s is largest) for s in shapes]

