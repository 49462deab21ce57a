"""The Whisper-VQ encoder (the reference's `WhisperVQEncoder`, encoder-only): log-mel frames → audio codes.

    mel [B, 128, T] (100 frames/s) → causal conv1 (k3) → GELU → causal conv2 (k3, stride 2) → GELU   [B, T/2, 1280]
    + embed_positions[0, 1, ...]  → 16 pre-norm causal transformer layers                               [B, T/2, 1280]
    → average pool of 4 frames → the nearest codebook vector's index                                     [B, T/8] codes

Every part reads only the past, so a stream is encoded as its audio arrives (`start` / `feed` / `finish`) and gives
the codes an offline pass over the same frames gives: each convolution keeps the input frames its next output needs,
each layer its keys and values (in the stream's slot of a KVPool), the pool the frames of an unfinished group. `feed`
takes many streams at once: their new frames go through each layer packed as rows of one matrix, [N, 1280], so the
projections and MLPs are one product each for all of them, and the attention one kernel on CUDA (attention.py). (The
reference computes a block-causal mask but hands its causal layers none: they attend causally, as here.)

Positions run to max_source_positions (30 s); the reference encodes longer audio as independent 30 s segments,
and so does a stream (`segment_mel_frames`). Module and parameter names are the reference's (`conv1`, `conv2`,
`embed_positions`, `layers.N.self_attn.{q,k,v,out}_proj`, `layers.N.self_attn_layer_norm`, `layers.N.fc1`,
`layers.N.fc2`, `layers.N.final_layer_norm`, `codebook`, `embed_positions2`), so the official weights load by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from services.encoder import attention
from services.encoder.attention import Layout
from services.encoder.config import WhisperVQConfig
from services.encoder.kv_pool import KVPool


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

    def forward(self, x: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, layout: Layout) -> torch.Tensor:
        """x [N, dim]: several streams' new frames packed (attention.py's layout); their keys and values go to the
        streams' slots of this layer's pool [slots, heads, frames, d], then each frame reads its stream's up to itself."""
        N, dim = x.shape
        q, k, v = (p(x).view(N, self.heads, -1) for p in (self.q_proj, self.k_proj, self.v_proj))  # [N, heads, d]
        attention.write(k_pool, v_pool, k, v, layout)
        return self.out_proj(attention.attend(q, k_pool, v_pool, layout).reshape(N, dim))


class WhisperVQEncoderLayer(nn.Module):
    def __init__(self, cfg: WhisperVQConfig):
        super().__init__()
        dim = cfg.d_model
        self.self_attn = WhisperAttention(dim, cfg.encoder_attention_heads)
        self.self_attn_layer_norm, self.final_layer_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, cfg.encoder_ffn_dim), nn.Linear(cfg.encoder_ffn_dim, dim)

    def forward(self, x: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, layout: Layout) -> torch.Tensor:
        """x [N, dim] packed as WhisperAttention reads it → [N, dim]."""
        x = x + self.self_attn(self.self_attn_layer_norm(x), k_pool, v_pool, layout)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


@dataclass
class EncoderState:
    """One stream's place in a segment: the convolutions' pending inputs ([1, C, p]), its slot of the keys and values
    (kv_pool.py), the frames of an unfinished pool group ([< pooling_kernel_size, dim]), and how many frames (after
    conv2) it has had."""

    conv1: torch.Tensor
    conv2: torch.Tensor
    slot: int
    group: torch.Tensor
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
    def start(self, pool: KVPool) -> EncoderState:
        """A stream's segment, in a slot of `pool` (PoolFull if none is free) until `finish`. A stream starts a new
        one every segment_mel_frames."""
        like = self.conv1.weight
        return EncoderState(self.conv1.initial(1, like), self.conv2.initial(1, like), pool.take(),
                            like.new_zeros(0, self.cfg.d_model))

    def feed(self, states: list[EncoderState], mels: list[torch.Tensor], pool: KVPool) -> list[torch.Tensor]:
        """Each stream's next mel frames [n_mels, n_i] → the codes they complete, per stream [c_i] (int64): the
        streams' new frames go through the layers packed together (the projections and MLPs in one product each,
        the attention in one kernel on CUDA)."""
        h, rows, past, at = [], [], [], 0
        for state, x in zip(states, self._front(states, mels)):
            t = x.shape[0]
            if state.frames + t > self.cfg.max_source_positions:
                raise ValueError(f"a segment holds {self.cfg.max_source_positions} frames; {state.frames + t} given "
                                 f"(start a new segment every {self.cfg.segment_mel_frames} mel frames)")
            h.append(x + self.embed_positions.weight[state.frames : state.frames + t])
            rows.append(at)
            past.append(state.frames)
            state.frames, at = state.frames + t, at + t
        packed = torch.cat(h)                                                                      # [N, dim]
        counts = [len(x) for x in h]
        if at:
            layout = Layout([s.slot for s in states], rows, counts, past, packed.device)
            for j, layer in enumerate(self.layers):
                packed = layer(packed, pool.k[j], pool.v[j], layout)
        k, groups, codes = self.cfg.pooling_kernel_size, [], []
        for state, row, t in zip(states, rows, counts):
            x = torch.cat([state.group, packed[row : row + t]])
            whole = x.shape[0] // k * k
            state.group = x[whole:]
            groups.append(x[:whole].unflatten(0, (-1, k)).mean(1))
            codes.append(whole // k)
        return list(self.quantize(torch.cat(groups)).split(codes))

    def _front(self, states: list[EncoderState], mels: list[torch.Tensor]) -> list[torch.Tensor]:
        """The two causal convolutions for every stream's new frames → each stream's [t_i, dim]. Streams with as many
        new frames and as many inputs pending in conv2 (its stride makes that 2 or 3) run as one batch: a call of
        many speakers sending like chunks is a few convolutions, not two per speaker. The frames go to the device
        once per batch."""
        w = self.conv1.weight
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (state, mel) in enumerate(zip(states, mels)):
            groups.setdefault((mel.shape[1], state.conv2.shape[2]), []).append(i)
        out: list[torch.Tensor | None] = [None] * len(states)
        for members in groups.values():
            mel = torch.stack([mels[i] for i in members]).to(w)                                  # [G, n_mels, n]
            x, pending1 = self.conv1.step(torch.cat([states[i].conv1 for i in members]), mel)
            x, pending2 = self.conv2.step(torch.cat([states[i].conv2 for i in members]), F.gelu(x))
            x = F.gelu(x).transpose(1, 2)                                                         # [G, t, dim]
            for j, i in enumerate(members):
                states[i].conv1, states[i].conv2 = pending1[j : j + 1], pending2[j : j + 1]
                out[i] = x[j]
        return out

    def finish(self, state: EncoderState, pool: KVPool) -> torch.Tensor:
        """The segment's end: the code of its unfinished group, its missing frames zeros (the reference pads so) →
        [0 or 1]; its slot goes back to the pool."""
        pool.give(state.slot)
        n = state.group.shape[0]
        if n == 0:
            return torch.zeros(0, dtype=torch.long, device=state.group.device)
        group, state.group = F.pad(state.group, (0, 0, 0, self.cfg.pooling_kernel_size - n)), state.group[:0]
        return self.quantize(group.mean(0, keepdim=True))

    def quantize(self, h: torch.Tensor) -> torch.Tensor:
        """h [c, dim] → the index of each row's nearest codebook vector [c] (squared distance, ties to the lower
        index, in float32)."""
        flat, book = h.float(), self.codebook.weight.float()
        return torch.addmm(book.pow(2).sum(1) + flat.pow(2).sum(1, keepdim=True), flat, book.t(), alpha=-2.0).argmin(1)

    # ---- offline --------------------------------------------------------------------------------
    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, n_mels, T] (T ≤ segment_mel_frames) → codes [B, ceil(T / mel_frames_per_code)]: each row a whole
        segment at once, as `feed` then `finish` give it (in a pool of its own, sized to the rows)."""
        w = self.conv1.weight
        pool = KVPool(self.cfg, mel.shape[0], w.device, w.dtype, frames=max(1, (mel.shape[2] + 1) // 2))
        states = [self.start(pool) for _ in range(mel.shape[0])]
        codes = self.feed(states, list(mel), pool)
        return torch.stack([torch.cat([c, self.finish(s, pool)]) for c, s in zip(codes, states)])
