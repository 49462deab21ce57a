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

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from services.vocoder.codec.config import FlowConfig
from services.vocoder.codec.conformer import UpsampleConformerEncoder
from services.vocoder.codec.estimator import CausalConditionalDecoder

NOISE_FRAMES = 50 * 300  # the reference's table: 300 s of 50 Hz mel frames, prompt and window together


def cosine_schedule(steps: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """[steps + 1] flow times from 0 to 1, dense near 0 where the mel takes shape."""
    t = torch.linspace(0, 1, steps + 1, dtype=dtype, device=device)
    return 1 - torch.cos(t * 0.5 * torch.pi)


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
        B, T, _ = mu.shape
        if noise_index is None:
            if T > self.noise.shape[-1]:
                raise ValueError(f"flow: {T} mel frames exceed the noise table's {self.noise.shape[-1]}")
            noise_index = torch.arange(T, device=mu.device).expand(B, -1)
        x = self.noise[0].t()[noise_index.clamp(max=self.noise.shape[-1] - 1)].to(mu.dtype)   # [B, T, 80]
        zeros = torch.zeros_like
        mu2, spks2, cond2 = torch.cat([mu, zeros(mu)]), torch.cat([spks, zeros(spks)]), torch.cat([cond, zeros(cond)])
        mask2 = torch.cat([mask, mask])
        t_span = cosine_schedule(self.n_timesteps, mu.dtype, mu.device)
        t, dt = t_span[0:1], t_span[1] - t_span[0]
        for step in range(1, self.n_timesteps + 1):
            if prefix is not None:
                prefix.step = step - 1
            v = self.estimator(torch.cat([x, x]), mask2, mu2, t.expand(2 * B), spks2, cond2, streaming, prefix)
            v_cond, v_free = v[:B], v[B:]
            x = x + dt * ((1.0 + self.cfg_rate) * v_cond - self.cfg_rate * v_free)
            t = t + dt
            if step < self.n_timesteps:
                dt = t_span[step + 1] - t
        return x


@dataclass
class FlowBatch:
    """Rows to decode, each [prompt tokens | tokens | look-ahead context | padding].

    tokens [B, T] long; lengths [B]: prompt + tokens (what is decoded); context [B]: look-ahead tokens after them
    (0 at a stream's end); prompt_mel [B, P, 80] (zeros past each row's prompt_frames); prompt_frames [B]
    (= prompt tokens × token_mel_ratio); embedding [B, 192] (the x-vector, unnormalized); noise_shift [B]: the
    row's first token's frame in its stream (its tokens' frames take the noise of their place in the stream);
    voice_index [B]: each row's voice in a PromptPrefix (prefix.py), when the call reads one."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    context: torch.Tensor
    prompt_mel: torch.Tensor
    prompt_frames: torch.Tensor
    embedding: torch.Tensor
    noise_shift: torch.Tensor
    voice_index: torch.Tensor | None = None


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
        solved again, and the mel starts after them ([B, 80, T·ratio - prefix.frames]); or its Recorder."""
        ratio = self.cfg.token_mel_ratio
        spks = self.spk_embed_affine_layer(F.normalize(batch.embedding, dim=1))
        T = batch.tokens.shape[1]
        pos = torch.arange(T, device=batch.tokens.device)
        present = (pos[None, :] < (batch.lengths + batch.context)[:, None])[..., None]
        x = self.input_embedding(batch.tokens.clamp(min=0)) * present.to(spks.dtype)
        h = self.encoder_proj(self.encoder(x, batch.lengths, batch.context, streaming))    # [B, T·ratio, 80]
        frames = torch.arange(T * ratio, device=h.device)
        mask = (frames[None, :] < (batch.lengths * ratio)[:, None]).to(h.dtype)[:, :, None]  # [B, T·ratio, 1]
        cond = torch.zeros_like(h)
        P = batch.prompt_mel.shape[1]
        cond[:, :P] = batch.prompt_mel.to(h.dtype) * (frames[None, :P, None] < batch.prompt_frames[:, None, None])
        # Noise by place in the stream: a frame decoded again in a later window (the window slid past the stream's
        # start) gets the noise it had, so the flow solves the same problem with less context, not a new one.
        after_prompt = frames[None, :] >= batch.prompt_frames[:, None]
        noise_index = frames[None, :] + batch.noise_shift[:, None] * after_prompt
        view = None
        if prefix is not None and prefix.recording:
            view = prefix                                            # recording: the whole prompt, kept as it goes
        elif prefix is not None:
            view, n = prefix.view(batch.voice_index), prefix.frames
            h, mask, cond, noise_index = h[:, n:], mask[:, n:], cond[:, n:], noise_index[:, n:]
        return self.decoder(h, mask, spks, cond, streaming, noise_index, view).transpose(1, 2)
