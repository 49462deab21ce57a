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
        self.graphs = None  # the layers' CUDA graphs over the service's pool (`capture`)

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
        the attention in one kernel on CUDA, the whole in one CUDA graph's replay when `capture` made them)."""
        xs = self._front(states, mels)                                                          # each [t_i, dim]
        counts = [x.shape[0] for x in xs]
        rows, past, at = [], [], 0
        for state, t in zip(states, counts):
            if state.frames + t > self.cfg.max_source_positions:
                raise ValueError(f"a segment holds {self.cfg.max_source_positions} frames; {state.frames + t} given "
                                 f"(start a new segment every {self.cfg.segment_mel_frames} mel frames)")
            rows.append(at)
            past.append(state.frames)
            state.frames, at = state.frames + t, at + t
        packed = torch.cat(xs)                                                                  # [N, dim]
        slots = [s.slot for s in states]
        if self.graphs is not None and self.graphs.pool is pool and self.graphs.fits(at, len(states)):
            packed = self.graphs.run(packed, slots, rows, counts, past)
        elif at:
            packed = self._layers(packed, Layout(slots, rows, counts, past, packed.device), pool)
        return self._pool_codes(states, packed, counts)

    def _layers(self, x: torch.Tensor, layout, pool: KVPool) -> torch.Tensor:
        """x [N, dim] (after the convolutions) → the positions added, the layers run → [N, dim]."""
        x = x + self.embed_positions.weight[layout.positions]
        for j, layer in enumerate(self.layers):
            x = layer(x, pool.k[j], pool.v[j], layout)
        return x

    def capture(self, pool: KVPool, max_streams: int, buckets: tuple[int, ...] | None = None) -> None:
        """CUDA graphs of the layers over `pool` (made with a scratch slot) for calls of up to `max_streams` streams;
        the calls on that pool replay them (graphs.py)."""
        from services.encoder.graphs import ROW_BUCKETS, LayerGraphs

        self.graphs = None  # (the old graphs' memory goes before the new ones are captured)
        self.graphs = LayerGraphs(lambda x, layout: self._layers(x, layout, pool), pool, max_streams,
                                  buckets or ROW_BUCKETS)

    def _pool_codes(self, states: list[EncoderState], packed: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
        """Each stream's frames of an unfinished group, then its new rows of `packed` [N, dim], averaged in groups
        of pooling_kernel_size → its codes [c_i]; what is left of a group waits in the stream for the next call.
        One gather for all streams (the rows' indices built on the host), not a few ops per stream."""
        k = self.cfg.pooling_kernel_size
        carried = [s.group.shape[0] for s in states]
        rows = torch.cat([*(s.group for s in states), packed])                 # [Σ carried + N, dim]
        grouped, left, codes, kept = [], [], [], []
        old, new = 0, sum(carried)
        for g, t in zip(carried, counts):
            seq = [*range(old, old + g), *range(new, new + t)]
            whole = len(seq) // k * k
            grouped += seq[:whole]
            left += seq[whole:]
            codes.append(whole // k)
            kept.append(len(seq) - whole)
            old, new = old + g, new + t
        picked = rows[torch.tensor(grouped + left, dtype=torch.long, device=rows.device)]
        whole = len(grouped)
        for state, rest in zip(states, picked[whole:].split(kept)):
            state.group = rest
        return list(self.quantize(picked[:whole].view(-1, k, picked.shape[1]).mean(1)).split(codes))

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
        return self.finish_many([state], pool)[0]

    def finish_many(self, states: list[EncoderState], pool: KVPool) -> list[torch.Tensor]:
        """The segments' ends: each one's unfinished group, its missing frames zeros (the reference pads so) → its
        last code [0 or 1]; the slots go back to the pool. The zeros are pooled as a call's new rows are
        (`_pool_codes`): one gather and one quantization for all of them."""
        for state in states:
            pool.give(state.slot)
        k = self.cfg.pooling_kernel_size
        missing = [-s.group.shape[0] % k for s in states]  # (an empty group: none, and no code)
        return self._pool_codes(states, self.codebook.weight.new_zeros(sum(missing), self.cfg.d_model), missing)

    def quantize(self, h: torch.Tensor) -> torch.Tensor:
        """h [c, dim] → the index of each row's nearest codebook vector [c] (squared distance, ties to the lower
        index, in float32)."""
        flat, book = h.float(), self.codebook.weight.float()
        return torch.addmm(book.pow(2).sum(1) + flat.pow(2).sum(1, keepdim=True), flat, book.t(), alpha=-2.0).argmin(1)

    # ---- offline --------------------------------------------------------------------------------
    def forward(self, mel: torch.Tensor, pool: KVPool | None = None) -> torch.Tensor:
        """mel [B, n_mels, T] (T ≤ segment_mel_frames) → codes [B, ceil(T / mel_frames_per_code)]: each row a whole
        segment at once, as `feed` then `finish` give it, in free slots of `pool` (the service's: its layers then
        replay from its CUDA graphs) or, without one or room in it, in a pool of its own sized to the rows."""
        rows = mel.shape[0]
        if pool is None or len(pool.free) < rows:
            w = self.conv1.weight
            pool = KVPool(self.cfg, rows, w.device, w.dtype, frames=max(1, (mel.shape[2] + 1) // 2))
        pool.borrowed += rows  # (held for this call alone: the service's count of speakers leaves them out)
        try:
            states = [self.start(pool) for _ in range(rows)]
            codes = self.feed(states, list(mel), pool)
            return torch.stack([torch.cat([c, last]) for c, last in zip(codes, self.finish_many(states, pool))])
        finally:
            pool.borrowed -= rows
