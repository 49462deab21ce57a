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
call is a CUDA graph (the encoder and all Euler steps), captured by `warm_up` before serving.

**The prompt's prefix** (prefix.py): the voices' prompts begin every row, and their first whole chunks are the
same in every call; `set_voices` computes them once, and calls of `prefix_min_rows` rows or more whose voices are
all known solve only the frames after them (at the real size, 180 of a saturated row's 320 frames). Smaller
calls solve every frame: they are bound by the latency of their kernels, not their work (H100: 16 rows 78 -> 58 ms
with the prefix, 4 rows 35 -> 32 ms, 1 row 26 -> 27 ms; docs/benchmarks.md, issue 20).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.vocoder.codec.flow import CausalMaskedDiffWithXvec, FlowBatch
from services.vocoder.codec.prefix import PromptPrefix
from services.vocoder.codec.voice import Voice
from services.vocoder.runner import smallest
from services.vocoder.token_decoder import TokenFormat

TOKEN_BUCKETS = (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)   # prompt + window tokens of a row
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32)  # a padding row costs a row: steps of 2-4
DEFAULT_BLOCK_TOKENS = 5
DEFAULT_MAX_CONTEXT_TOKENS = 40
PREFIX_MIN_ROWS = 4  # measured: 1 row slower with the prefix, 4 and 16 faster; 2 and 3 not measured


@dataclass(frozen=True)
class FlowState:
    """One stream: its voice, its tokens from absolute index `base` on, and how many it has decoded."""

    voice: Voice
    tokens: tuple[int, ...] = ()
    base: int = 0
    decoded: int = 0

    @property
    def received(self) -> int:
        return self.base + len(self.tokens)

    def window(self, start: int, end: int) -> list[int]:
        return list(self.tokens[start - self.base : end - self.base])


@dataclass(frozen=True)
class Plan:
    """One row of a call: tokens [start, end) after the prompt; [start, decode_end) decoded, the rest look-ahead
    context; frames of tokens [emit_from, decode_end) kept."""

    start: int
    decode_end: int
    end: int
    emit_from: int


class FlowTokenDecoder:
    def __init__(self, flow: CausalMaskedDiffWithXvec, device: torch.device, dtype: torch.dtype | None = None,
                 block_tokens: int = DEFAULT_BLOCK_TOKENS, max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
                 n_timesteps: int | None = None, cfg_rate: float | None = None, graphs: bool | None = None,
                 prefix_min_rows: int = PREFIX_MIN_ROWS):
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
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, FlowBatch, torch.Tensor]] = {}
        self.pool = None
        self.prefix: PromptPrefix | None = None
        self.prefix_min_rows = prefix_min_rows

    def set_voices(self, voices: list[Voice]) -> None:
        """The voices streams will speak in: their prompts' common prefix is solved now, once (prefix.py)."""
        prefix = PromptPrefix(self.flow, voices)
        self.prefix = prefix if prefix else None
        self.graphs, self.pool = {}, None  # graphs read the prefix's tensors: captured again

    # ---- streams ---------------------------------------------------------------------------------
    def start(self, voice: Voice) -> FlowState:
        return FlowState(voice)

    def first_block(self, voice: Voice) -> int:
        """The reference's first hop: the block, plus the tokens that end prompt + block on a multiple of it."""
        return self.block + (-len(voice.prompt_tokens)) % self.block

    def plan(self, state: FlowState, received: int, final: bool) -> Plan | None:
        """The row that decodes what is due with `received` tokens (final: the stream has ended); None: nothing."""
        done = state.decoded
        if final:
            if received <= done:
                return None
            decode_end = end = received
        else:
            first = self.first_block(state.voice) if done == 0 else self.block
            if received - done < first + self.lookahead:
                return None
            blocks = 1 + (received - done - first - self.lookahead) // self.block
            decode_end = done + first + (blocks - 1) * self.block
            end = decode_end + self.lookahead
        start = max(0, min(done, end - self.max_context))
        return Plan(start, decode_end, end, done)

    def pending_frames(self, state: FlowState, new_tokens: int | None) -> int:
        plan = self.plan(state, state.received + (new_tokens or 0), new_tokens is None)
        return 0 if plan is None else (plan.decode_end - plan.emit_from) * self.ratio

    # ---- decoding --------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode_chunks(self, chunks: list[tuple[list[int] | None, FlowState]]) -> list[tuple[torch.Tensor, FlowState]]:
        """[(a stream's new tokens, or None at its end; its state)] → [(mel [80, n] float32, its next state)]:
        n = 0 until a block is due. Every due row in one batched flow call (padded rows never mix)."""
        states, plans = [], []
        for tokens, state in chunks:
            if tokens:
                state = FlowState(state.voice, state.tokens + tuple(tokens), state.base, state.decoded)
            states.append(state)
            plans.append(self.plan(state, state.received, tokens is None))
        rows = [i for i, p in enumerate(plans) if p is not None]
        mels = self._run([(states[i], plans[i]) for i in rows]) if rows else []
        out = []
        for i, (state, plan) in enumerate(zip(states, plans)):
            mel = torch.zeros(self.cfg.num_mels, 0, device=self.device)
            if plan is not None:
                mel = mels[rows.index(i)]
                keep = max(0, plan.decode_end - self.max_context)  # no later window starts before this
                state = FlowState(state.voice, tuple(state.window(keep, state.received)), keep, plan.decode_end)
            out.append((mel, state))
        return out

    def _run(self, rows: list[tuple[FlowState, Plan]]) -> list[torch.Tensor]:
        """Rows → each row's kept frames, mel [80, n] float32, on the device."""
        lengths = [len(s.voice.prompt_tokens) + p.end - p.start for s, p in rows]
        longest = max(lengths)
        graph = self.use_graphs and smallest(TOKEN_BUCKETS, longest) is not None and len(rows) <= BATCH_BUCKETS[-1]
        T = smallest(TOKEN_BUCKETS, longest) if graph else longest
        B = smallest(BATCH_BUCKETS, len(rows)) if graph else len(rows)
        prefixed = self._prefixed(B, [s.voice for s, _ in rows])
        batch = self._batch(rows, B, T, prefixed)
        if graph:
            cuda_graph, static, static_out = self._graph(B, T, prefixed)
            for name in ("tokens", "lengths", "context", "prompt_mel", "prompt_frames", "embedding", "noise_shift",
                         "voice_index"):
                getattr(static, name).copy_(getattr(batch, name))
            cuda_graph.replay()
            mel = static_out
        else:
            mel = self.flow(batch, streaming=True, prefix=self.prefix if prefixed else None)
        skipped = self.prefix.frames if prefixed else 0  # the mel starts after the prompt's prefix
        out = []
        for row, (state, plan) in enumerate(rows):
            prompt = len(state.voice.prompt_tokens)
            a, b = (prompt + plan.emit_from - plan.start) * self.ratio, (prompt + plan.decode_end - plan.start) * self.ratio
            out.append(mel[row, :, a - skipped : b - skipped].float().clone())  # a copy: a replay overwrites it
        return out

    def _prefixed(self, B: int, voices) -> bool:
        """Whether a call of B rows (its batch bucket) in these voices reads the prompt prefix."""
        return self.prefix is not None and B >= self.prefix_min_rows and self.prefix.covers(voices)

    def _batch(self, rows: list[tuple[FlowState, Plan]], B: int, T: int, prefixed: bool = False) -> FlowBatch:
        """Rows padded to [B, T] (padding rows: one token of code 0, no prompt, the first voice's prefix) on the
        device."""
        tokens = torch.zeros(B, T, dtype=torch.long)
        lengths, context = torch.ones(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
        prompt_mel = torch.zeros(B, T * self.ratio, self.cfg.num_mels)
        prompt_frames = torch.zeros(B, dtype=torch.long)
        embedding = torch.zeros(B, rows[0][0].voice.embedding.shape[0])
        noise_shift, voice_index = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
        for row, (state, plan) in enumerate(rows):
            voice = state.voice
            seq = torch.cat([voice.prompt_tokens, torch.tensor(state.window(plan.start, plan.end), dtype=torch.long)])
            tokens[row, : len(seq)] = seq
            lengths[row] = len(voice.prompt_tokens) + plan.decode_end - plan.start
            context[row] = plan.end - plan.decode_end
            prompt_mel[row, : voice.prompt_frames] = voice.prompt_mel
            prompt_frames[row] = voice.prompt_frames
            embedding[row] = voice.embedding
            noise_shift[row] = plan.start * self.ratio
            if prefixed:
                voice_index[row] = self.prefix.voice_index(voice)
        to = dict(device=self.device)
        return FlowBatch(tokens.to(**to), lengths.to(**to), context.to(**to), prompt_mel.to(dtype=self.dtype, **to),
                         prompt_frames.to(**to), embedding.to(dtype=self.dtype, **to), noise_shift.to(**to),
                         voice_index.to(**to))

    # ---- graphs ----------------------------------------------------------------------------------
    def _graph(self, B: int, T: int, prefixed: bool):
        key = (B, T, prefixed)
        if key not in self.graphs:
            static = self._empty(B, T)
            prefix = self.prefix if prefixed else None
            self.flow(static, streaming=True, prefix=prefix)  # warm-up outside capture (cuBLAS and cuDNN choices)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.flow(static, streaming=True, prefix=prefix)
            self.pool = graph.pool()
            self.graphs[key] = (graph, static, out)
        return self.graphs[key]

    def _empty(self, B: int, T: int) -> FlowBatch:
        to = dict(device=self.device)
        return FlowBatch(torch.zeros(B, T, dtype=torch.long, **to), torch.ones(B, dtype=torch.long, **to),
                         torch.zeros(B, dtype=torch.long, **to),
                         torch.zeros(B, T * self.ratio, self.cfg.num_mels, dtype=self.dtype, **to),
                         torch.zeros(B, dtype=torch.long, **to),
                         torch.zeros(B, self.flow.cfg.spk_embed_dim, dtype=self.dtype, **to),
                         torch.zeros(B, dtype=torch.long, **to), torch.zeros(B, dtype=torch.long, **to))

    @torch.inference_mode()
    def warm_up(self, voices: list[Voice], max_batch: int) -> None:
        """Capture the graphs every call can need: batch buckets up to max_batch; token buckets from the
        shortest voice's first block to the longest voice's prompt with a whole context window."""
        if not self.use_graphs:
            return
        prompts = [len(v.prompt_tokens) for v in voices]
        low = smallest(TOKEN_BUCKETS, min(prompts) + self.block + self.lookahead) or TOKEN_BUCKETS[-1]
        high = smallest(TOKEN_BUCKETS, max(prompts) + self.max_context) or TOKEN_BUCKETS[-1]
        ceiling = smallest(BATCH_BUCKETS, max_batch) or BATCH_BUCKETS[-1]
        for B in (b for b in BATCH_BUCKETS if b <= ceiling):
            for T in (t for t in TOKEN_BUCKETS if low <= t <= high):
                self._graph(B, T, self._prefixed(B, voices))
