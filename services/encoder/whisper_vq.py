"""The Whisper-VQ encoder (the reference's `WhisperVQEncoder`, encoder-only): log-mel frames → audio codes.

    mel [B, 128, T] (100 frames/s) → causal conv1 (k3) → GELU → causal conv2 (k3, stride 2) → GELU   [B, T/2, 1280]
    + embed_positions[0, 1, ...]  → 16 pre-norm causal transformer layers                               [B, T/2, 1280]
    → average pool of 4 frames → the nearest codebook vector's index                                     [B, T/8] codes

Every part reads only the past, so a stream is encoded as its audio arrives (`start` / `feed` / `finish`) and gives
the codes an offline pass over the same frames gives: each convolution keeps the input frames its next output needs,
each layer its keys and values, the pool the frames of an unfinished group. (The reference computes a block-causal
mask but hands its causal layers none: they attend causally, which is what runs here.)

Positions run to max_source_positions (30 s); the reference encodes longer audio as independent 30 s segments,
and so does a stream (`segment_mel_frames`). Module and parameter names are the reference's (`conv1`, `conv2`,
`embed_positions`, `layers.N.self_attn.{q,k,v,out}_proj`, `layers.N.self_attn_layer_norm`, `layers.N.fc1`,
`layers.N.fc2`, `layers.N.final_layer_norm`, `codebook`, `embed_positions2`), so the official weights load by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from services.encoder.config import WhisperVQConfig


class CausalConv1d(nn.Conv1d):
    """A convolution over frames with (kernel - 1) zeros on the left: output j reads inputs j·stride - k + 1 ..
    j·stride. `pending`: the inputs not yet consumed by an output, [B, Cin, n] (starts as the zeros)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1):
        super().__init__(cin, cout, kernel, stride=stride)

    def initial(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        return like.new_zeros(batch, self.in_channels, self.kernel_size[0] - 1)

    def step(self, pending: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pending [B, Cin, p] + new inputs x [B, Cin, n] → (every output they complete [B, Cout, m], what the
        next outputs still need)."""
        x = torch.cat([pending, x], 2)
        k, s = self.kernel_size[0], self.stride[0]
        m = (x.shape[2] - k) // s + 1 if x.shape[2] >= k else 0
        if m == 0:
            return x.new_zeros(x.shape[0], self.out_channels, 0), x
        return F.conv1d(x[:, :, : (m - 1) * s + k], self.weight, self.bias, s), x[:, :, m * s :]


class WhisperAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None):
        """x [B, t, dim], the frames after the cached ones (cache: keys and values [B, heads, past, d]) →
        ([B, t, dim], the cache with x's keys and values). Frame i reads the cached frames and x's up to i."""
        B, t, dim = x.shape
        q, k, v = (p(x).view(B, t, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        past = k.shape[2] - t
        allowed = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(past)       # [t, past + t]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)                       # [B, heads, t, d]
        return self.out_proj(out.transpose(1, 2).reshape(B, t, dim)), (k, v)


class WhisperVQEncoderLayer(nn.Module):
    def __init__(self, cfg: WhisperVQConfig):
        super().__init__()
        dim = cfg.d_model
        self.self_attn = WhisperAttention(dim, cfg.encoder_attention_heads)
        self.self_attn_layer_norm, self.final_layer_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, cfg.encoder_ffn_dim), nn.Linear(cfg.encoder_ffn_dim, dim)

    def forward(self, x: torch.Tensor, cache=None):
        attended, cache = self.self_attn(self.self_attn_layer_norm(x), cache)
        x = x + attended
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x)))), cache


@dataclass
class EncoderState:
    """One batch of streams' place in a segment: the convolutions' pending inputs, each layer's keys and values,
    the frames of an unfinished pool group, and how many frames (after conv2) the segment has had."""

    conv1: torch.Tensor
    conv2: torch.Tensor
    kv: list = field(default_factory=list)
    pool: torch.Tensor | None = None   # [B, < pooling_kernel_size, dim]
    frames: int = 0


class WhisperVQEncoder(nn.Module):
    def __init__(self, cfg: WhisperVQConfig):
        super().__init__()
        self.cfg = cfg
        dim = cfg.d_model
        self.conv1 = CausalConv1d(cfg.num_mel_bins, dim, 3)
        self.conv2 = CausalConv1d(dim, dim, 3, stride=2)
        self.embed_positions = nn.Embedding(cfg.max_source_positions, dim)
        self.layers = nn.ModuleList(WhisperVQEncoderLayer(cfg) for _ in range(cfg.quantize_position))
        self.codebook = nn.Embedding(cfg.quantize_vocab_size, dim)
        # The reference's positions for layers after the quantizer (none run here); kept so its weights load as they are.
        self.embed_positions2 = nn.Embedding(math.ceil(cfg.max_source_positions / cfg.pooling_kernel_size), dim)

    # ---- streaming ------------------------------------------------------------------------------
    def start(self, batch: int = 1) -> EncoderState:
        like = self.conv1.weight
        return EncoderState(self.conv1.initial(batch, like), self.conv2.initial(batch, like),
                            [None] * len(self.layers), like.new_zeros(batch, 0, self.cfg.d_model))

    def feed(self, state: EncoderState, mel: torch.Tensor) -> torch.Tensor:
        """The next mel frames of each stream, [B, n_mels, n] → the codes they complete [B, c] (int64). A segment
        holds at most segment_mel_frames; the caller starts the next one (`start`) after it."""
        h, state.conv1 = self.conv1.step(state.conv1, mel)
        h, state.conv2 = self.conv2.step(state.conv2, F.gelu(h))
        h = F.gelu(h).transpose(1, 2)                                                              # [B, t, dim]
        t = h.shape[1]
        if state.frames + t > self.cfg.max_source_positions:
            raise ValueError(f"a segment holds {self.cfg.max_source_positions} frames; "
                             f"{state.frames + t} given (start a new segment every {self.cfg.segment_mel_frames} mel frames)")
        if t:
            h = h + self.embed_positions.weight[state.frames : state.frames + t]
            state.frames += t
            for i, layer in enumerate(self.layers):
                h, state.kv[i] = layer(h, state.kv[i])
        h = torch.cat([state.pool, h], 1)
        k = self.cfg.pooling_kernel_size
        whole = h.shape[1] // k * k
        state.pool = h[:, whole:]
        return self.quantize(h[:, :whole].unflatten(1, (-1, k)).mean(2))

    def finish(self, state: EncoderState) -> torch.Tensor:
        """The code of an unfinished group, its missing frames zeros (the reference pads so) → [B, 0 or 1]."""
        n = state.pool.shape[1]
        if n == 0:
            return torch.zeros(state.pool.shape[0], 0, dtype=torch.long, device=state.pool.device)
        group, state.pool = F.pad(state.pool, (0, 0, 0, self.cfg.pooling_kernel_size - n)), state.pool[:, :0]
        return self.quantize(group.mean(1, keepdim=True))

    def quantize(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, c, dim] → the index of each frame's nearest codebook vector [B, c] (squared distance, ties to
        the lower index, in float32)."""
        flat, book = h.reshape(-1, h.shape[-1]).float(), self.codebook.weight.float()
        distances = torch.addmm(book.pow(2).sum(1) + flat.pow(2).sum(1, keepdim=True), flat, book.t(), alpha=-2.0)
        return distances.argmin(1).view(h.shape[:2])

    # ---- offline --------------------------------------------------------------------------------
    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, n_mels, T] (T ≤ segment_mel_frames) → codes [B, ceil(T / mel_frames_per_code)]: the whole
        segment at once, as `feed` then `finish` give it."""
        state = self.start(mel.shape[0])
        return torch.cat([self.feed(state, mel), self.finish(state)], 1)
