"""Audio tokens → mel: the reference's `CausalMaskedDiffWithXvec` and its conditional flow matching.

A voice prompt's tokens go before the tokens to decode and its mel is the condition over the prompt's frames;
the speaker x-vector conditions every frame. The encoder turns tokens into mu (4 frames per token), then an
Euler solver integrates the estimator's velocity from noise (a fixed table, frame i of a row always gets
noise column i, so a block decoded again gives the same frames) to mel over a cosine time schedule, with
classifier-free guidance: the velocity is (1 + r)·v(cond) - r·v(no cond), both halves one batch of 2B rows.

Names are the reference's (`input_embedding`, `spk_embed_affine_layer`, `encoder.*`, `encoder_proj`,
`decoder.estimator.*`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from services.vocoder.codec.config import FlowConfig
from services.vocoder.codec.conformer import UpsampleConformerEncoder
from services.vocoder.codec.encoder_state import extend_rows
from services.vocoder.codec.estimator import CausalConditionalDecoder
from services.vocoder.codec.frame_ops import euler_step

NOISE_FRAMES = 50 * 300  # the reference's table: 300 s of 50 Hz mel frames, prompt and window together


def cosine_schedule(steps: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """[steps + 1] flow times from 0 to 1, dense near 0 where the mel takes shape."""
    t = torch.linspace(0, 1, steps + 1, dtype=dtype, device=device)
    return 1 - torch.cos(t * 0.5 * torch.pi)


@functools.lru_cache(maxsize=None)
def flow_times(steps: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[steps]: euler_times' t on the device, made once (a copy from the host, which a CUDA graph's capture refuses:
    the decoder's first call of a shape runs before its capture)."""
    return torch.tensor([t for t, _ in euler_times(steps, dtype)], dtype=dtype, device=device)


@functools.lru_cache(maxsize=None)
def step_sizes(steps: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[steps] float32: euler_times' dt on the device (solve_step's: each row's own)."""
    return torch.tensor([dt for _, dt in euler_times(steps, dtype)], dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=None)
def euler_times(steps: int, dtype: torch.dtype) -> tuple[tuple[float, float], ...]:
    """Each Euler step's (t, dt), as the reference's solver reaches them: its tensor arithmetic in `dtype`
    (t accumulates dt, dt is the next scheduled time minus t). Numbers known before any call: no kernels."""
    span = cosine_schedule(steps, dtype)
    t, dt = span[0], span[1] - span[0]
    times = []
    for step in range(1, steps + 1):
        times.append((t.item(), dt.item()))
        t = t + dt
        if step < steps:
            dt = span[step + 1] - t
    return tuple(times)


class ConditionalCFM(nn.Module):
    def __init__(self, cfg: FlowConfig):
        super().__init__()
        self.estimator = CausalConditionalDecoder(cfg.estimator)
        self.n_timesteps, self.cfg_rate = cfg.n_timesteps, cfg.inference_cfg_rate
        # The reference draws its noise once, [1, 80, 15000] from seed 0: the same table here, so that official
        # weights decode what the reference decodes.
        gen = torch.Generator().manual_seed(0)
        self.register_buffer("noise", torch.randn(1, cfg.output_size, NOISE_FRAMES, generator=gen), persistent=False)

    def forward(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
                streaming: bool, noise_index: torch.Tensor | None = None, prefix=None) -> torch.Tensor:
        """mu, cond [B, T, 80]; mask [B, T, 1]; spks [B, 80]; noise_index [B, T]: the noise table's column for each
        frame (None: frame i takes column i, as the reference's) → mel [B, T, 80]. prefix: prefix.py's, told
        the Euler step before each estimator call."""
        inputs, lengths = self.start(mu, mask, spks, cond, noise_index)
        times = euler_times(self.n_timesteps, mu.dtype)
        terms = self.estimator.time_terms(flow_times(self.n_timesteps, mu.dtype, mu.device))   # [S, R, C]
        for step, (_, dt) in enumerate(times):
            if prefix is not None:
                prefix.step = step
            v = self.estimator(inputs, lengths, terms[step : step + 1], streaming, prefix)
            euler_step(inputs, v, mask, dt, self.cfg_rate)
        return inputs[: mu.shape[0], :, : mu.shape[2]]

    def start(self, mu: torch.Tensor, mask: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor,
              noise_index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """forward's arguments → (the estimator's input for the CFG pair [2B, T, 4·80]: x | mu | speaker | cond, the
        unconditioned rows' conditions zero, x the rows' noise; each row's valid frames [2B] int32). Only x changes
        between steps: euler_step writes it into both halves in place."""
        B, T, _ = mu.shape
        if noise_index is None:
            if T > self.noise.shape[-1]:
                raise ValueError(f"flow: {T} mel frames exceed the noise table's {self.noise.shape[-1]}")
            noise_index = torch.arange(T, device=mu.device).expand(B, -1)
        x = self.noise[0].t()[noise_index.clamp(max=self.noise.shape[-1] - 1)].to(mu.dtype)   # [B, T, 80]
        zeros = torch.zeros_like
        inputs = torch.cat([torch.cat([x, x]), torch.cat([mu, zeros(mu)]),
                            torch.cat([spks, zeros(spks)])[:, None, :].expand(-1, T, -1), torch.cat([cond, zeros(cond)])],
                           dim=-1)
        return inputs, mask[:, :, 0].sum(1).to(torch.int32).repeat(2)

    def solve_step(self, inputs: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor, steps: torch.Tensor,
                   streaming: bool, prefix=None, terms: torch.Tensor | None = None) -> None:
        """One Euler step of B rows, each at its own step: the solve of rows that joined it at different times (as
        an LLM engine batches requests at different positions). inputs [2B, T, 4·80] and lengths [2B] (start's),
        mask [B, T, 1], steps [B] long (0 … n_timesteps - 1: each row's time term, step size, and the prefix's and
        history's keys of that step) → inputs advanced in place. A row's steps one after another, in batches with
        any other rows, give what forward gives it (tests/test_codec_solve.py). terms: the time terms of every step,
        [S, R, C] (time_terms; made here if not given: they depend on the weights alone)."""
        if terms is None:
            terms = self.estimator.time_terms(flow_times(self.n_timesteps, inputs.dtype, inputs.device))
        both = torch.cat([steps, steps])                                                        # [2B]: the CFG pair
        if prefix is not None:
            prefix.step = both
        v = self.estimator(inputs, lengths, terms[both], streaming, prefix)
        euler_step(inputs, v, mask, step_sizes(self.n_timesteps, inputs.dtype, inputs.device)[steps], self.cfg_rate)


@dataclass
class FlowBatch:
    """Rows to decode, each [prompt tokens | tokens | look-ahead context | padding].

    tokens [B, T] long; lengths [B]: prompt + tokens (what is decoded); context [B]: look-ahead tokens after them
    (0 at a stream's end); prompt_mel [B, P, 80] (zeros past each row's prompt_frames); prompt_frames [B]
    (= prompt tokens × token_mel_ratio); embedding [B, 192] (the x-vector, unnormalized); noise_shift [B]: the
    row's first token's frame in its stream (its tokens' frames take the noise of their place in the stream);
    voice_index [B]: each row's voice in a PromptPrefix (prefix.py), when the call reads one.

    With a stream history (history.py) a row solves only its stream's new frames: solve_index [B, N] (the window's
    frames they are, padded with any), solve_frames [B] (how many), history (the rows' places in it)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    context: torch.Tensor
    prompt_mel: torch.Tensor
    prompt_frames: torch.Tensor
    embedding: torch.Tensor
    noise_shift: torch.Tensor
    voice_index: torch.Tensor | None = None
    solve_index: torch.Tensor | None = None
    solve_frames: torch.Tensor | None = None
    history: object | None = None  # history.HistoryRows
    encoder_rows: object | None = None  # encoder_state.EncoderRows: the encoder over the rows' new positions only


class CausalMaskedDiffWithXvec(nn.Module):
    def __init__(self, cfg: FlowConfig):
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.encoder = UpsampleConformerEncoder(cfg.input_size, cfg.encoder, cfg.pre_lookahead_len)
        self.encoder_proj = nn.Linear(cfg.encoder.output_size, cfg.output_size)
        self.decoder = ConditionalCFM(cfg)

    def forward(self, batch: FlowBatch, streaming: bool = True, prefix=None) -> torch.Tensor:
        """→ mel [B, 80, T·token_mel_ratio] (T: the batch's row length), each row valid for lengths·ratio frames;
        its first prompt_frames frames are the prompt's own (solved along, not returned to a listener).

        prefix (streaming): a PromptPrefix (prefix.py) whose frames every row's prompt begins with: they are not
        solved again, and the mel starts after them ([B, 80, T·ratio - prefix.frames]); or its Recorder; or, with
        batch.history, a StreamHistory (history.py): the mel is the solved frames' ([B, 80, N])."""
        mu, mask, spks, cond, noise_index, view = self.prepare(batch, streaming, prefix)
        return self.decoder(mu, mask, spks, cond, streaming, noise_index, view).transpose(1, 2)

    def prepare(self, batch: FlowBatch, streaming: bool = True, prefix=None) -> tuple:
        """The solver's arguments for a batch: (mu, mask, spks, cond, noise_index, what the estimator reads of the
        prefix or history: prefix.py's and history.py's views), for the frames after the prefix, or the solved ones."""
        ratio = self.cfg.token_mel_ratio
        spks = self.spk_embed_affine_layer(F.normalize(batch.embedding, dim=1))
        T = batch.tokens.shape[1]
        x = self.input_embedding(batch.tokens.clamp(min=0))
        frames = torch.arange(T * ratio, device=x.device)[None, :]      # [1 or B, T·ratio]: their places in the row
        if batch.encoder_rows is None:
            present = (torch.arange(T, device=x.device)[None, :] < (batch.lengths + batch.context)[:, None])
            h = self.encoder(x * present[..., None].to(spks.dtype), batch.lengths, batch.context, streaming)
        else:  # the encoder's state kept: the row holds its positions from encoder_rows.done on (encoder_state.py)
            rows = batch.encoder_rows
            h = extend_rows(self.encoder, prefix.encoder, rows.slot, rows.done, rows.final, batch.context, x, streaming)
            frames = frames + rows.done[:, None] * ratio
        h = self.encoder_proj(h)                                                            # [B, T·ratio, 80]
        mask = (frames < (batch.lengths * ratio)[:, None]).to(h.dtype)[:, :, None]          # [B, T·ratio, 1]
        cond = torch.zeros_like(h)
        P = batch.prompt_mel.shape[1]
        cond[:, :P] = batch.prompt_mel.to(h.dtype) * (frames[:, :P, None] < batch.prompt_frames[:, None, None])
        # Noise by place in the stream: a frame decoded again in a later window (the window slid past the stream's
        # start) gets the noise it had, so the flow solves the same problem with less context, not a new one.
        after_prompt = frames >= batch.prompt_frames[:, None]
        noise_index = frames + batch.noise_shift[:, None] * after_prompt
        view = None
        if prefix is not None and prefix.recording:
            view = prefix                                            # recording: the whole prompt, kept as it goes
        elif batch.history is not None:
            view = prefix.view(batch.voice_index, batch.history, batch.solve_frames)
            index = batch.solve_index                                            # [B, N]
            h, cond = (t.gather(1, index[..., None].expand(-1, -1, t.shape[-1])) for t in (h, cond))
            noise_index = noise_index.gather(1, index)
            mask = (torch.arange(index.shape[1], device=h.device)[None, :] < batch.solve_frames[:, None])
            mask = mask.to(h.dtype)[:, :, None]
        elif prefix is not None:
            view, n = prefix.view(batch.voice_index), prefix.frames
            h, mask, cond, noise_index = h[:, n:], mask[:, n:], cond[:, n:], noise_index[:, n:]
        return h, mask, spks, cond, noise_index, view
