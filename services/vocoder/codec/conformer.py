"""The flow's token encoder (the reference's `UpsampleConformerEncoder`): token embeddings → a look-ahead
convolution → conformer layers → nearest ×stride upsampling and a causal convolution → conformer layers at
the mel frame rate. Attention is relative-position (Transformer-XL style, ESPnet's encoding) and, when
streaming, static-chunk causal: a position sees every position of its own chunk and the chunks before.

Module and parameter names are the reference's (`embed.out.0`, `pre_lookahead_layer.conv1`,
`encoders.N.self_attn.linear_q`, ...), so its state dict loads by name.

Batching: rows are padded at their ends; a row's outputs are those it has alone. Everything here is causal
except the look-ahead convolution, which reads `pre_lookahead_len` positions to the right: each row's
look-ahead context sits right after its tokens and zeros after that, as it would alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from services.vocoder.codec.config import EncoderConfig
from services.vocoder.codec.estimator import laid_out


def chunk_mask(lengths: torch.Tensor, size: int, chunk: int) -> torch.Tensor:
    """lengths [B] → bool [B, size, size]: query i may read key j (j valid, and j's chunk ≤ i's; chunk 0: all)."""
    pos = torch.arange(size, device=lengths.device)
    valid = pos[None, :] < lengths[:, None]                                     # [B, size] keys
    if chunk <= 0:
        return valid[:, None, :].expand(-1, size, -1)
    block_end = (pos // chunk + 1) * chunk                                      # [size] per query
    return valid[:, None, :] & (pos[None, :] < block_end[:, None])[None]


def rel_sinusoids(distances: torch.Tensor, d_model: int) -> torch.Tensor:
    """distances [n] (a query's position less a key's) → ESPnet's relative encodings [n, d_model], float32."""
    freq = torch.exp(torch.arange(0, d_model, 2, device=distances.device, dtype=torch.float32)
                     * -(math.log(10000.0) / d_model))
    angle = distances.to(torch.float32)[:, None] * freq
    pe = torch.zeros(len(distances), d_model, device=distances.device)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe


class RelPositionalEncoding(nn.Module):
    """ESPnet's relative encoding: scales x by √d and returns sinusoids for relative positions T-1 … -(T-1)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model, self.xscale = d_model, math.sqrt(d_model)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, d] → (x·√d, pos_emb [1, 2T-1, d]: row r holds relative position T-1-r)."""
        T = x.shape[1]
        pe = rel_sinusoids(torch.arange(T - 1, -T, -1, device=x.device), self.d_model)
        return x * self.xscale, pe[None].to(x.dtype)


class LinearEmbed(nn.Module):
    """The reference's LinearNoSubsampling: Linear → LayerNorm, then the positional encoding."""

    def __init__(self, idim: int, odim: int):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5), nn.Dropout(0.0))
        self.pos_enc = RelPositionalEncoding(odim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pos_enc(self.out(x))


class RelPositionAttention(nn.Module):
    def __init__(self, n_head: int, n_feat: int):
        super().__init__()
        self.h, self.d_k = n_head, n_feat // n_head
        self.linear_q, self.linear_k = nn.Linear(n_feat, n_feat), nn.Linear(n_feat, n_feat)
        self.linear_v, self.linear_out = nn.Linear(n_feat, n_feat), nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))
        # q, k and v as one matrix product: their weights and biases stacked [3·n_feat, n_feat], [3·n_feat]
        linears = (self.linear_q, self.linear_k, self.linear_v)
        laid_out(self, "qkv_weight", lambda: torch.cat([m.weight for m in linears]))
        laid_out(self, "qkv_bias", lambda: torch.cat([m.bias for m in linears]))

    def forward(self, x: torch.Tensor, blocked: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        """x [B, T, d], blocked bool [B, 1, T, T] (query i may not read key j: ~chunk_mask), pos_emb [1, 2T-1, d]
        → [B, T, d]."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x)
        # Query i, key j are i - j apart: pos_emb row T-1-(i-j).
        i, j = torch.arange(T, device=x.device)[:, None], torch.arange(T, device=x.device)[None, :]
        return self.attend(q, k, v, pos_emb[0], (T - 1 - i + j).expand(B, self.h, T, T), blocked)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, d] → q, k, v [B, h, T, d_k], in one matrix product."""
        B, T, _ = x.shape
        return (F.linear(x, self.qkv_weight, self.qkv_bias).view(B, T, 3, self.h, self.d_k)
                .permute(2, 0, 3, 1, 4).contiguous().unbind(0))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos_emb: torch.Tensor, rows: torch.Tensor,
               blocked: torch.Tensor) -> torch.Tensor:
        """Queries q [B, h, M, d_k] over keys and values k, v [B, h, K, d_k]: softmax((q+u)·k + (q+v)·p) / √d_k over
        the keys not blocked ([B, 1, M, K]; a query with none: zeros), where query m and key j take the relative
        encoding pos_emb[rows[b, h, m, j]] (pos_emb [n, d]) → [B, M, d].

        The work over [B, h, M, K] is most of a layer's at the flow's 320 frames: each pass over it is one kernel in
        place (the scores summed, masked, and a row with no key zeroed), and the 1/√d_k scale goes on the queries
        (exact for d_k = 64: a power of two)."""
        B, _, M, _ = q.shape
        p = self.linear_pos(pos_emb).view(-1, self.h, self.d_k).transpose(0, 1)            # [h, n, d_k]
        scale = 1 / math.sqrt(self.d_k)
        scores = ((q + self.pos_bias_u[:, None]) * scale) @ k.transpose(-2, -1)           # [B, h, M, K]
        position = ((q + self.pos_bias_v[:, None]) * scale) @ p.transpose(-2, -1)         # [B, h, M, n]
        scores += position.gather(-1, rows)
        attn = torch.softmax(scores.masked_fill_(blocked, float("-inf")), dim=-1).nan_to_num_(0.0)  # (no key: 0)
        return self.linear_out((attn @ v).transpose(1, 2).reshape(B, M, -1))


class FeedForward(nn.Module):
    def __init__(self, idim: int, hidden: int):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(idim, hidden), nn.Linear(hidden, idim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerLayer(nn.Module):
    """Pre-norm self-attention and feed-forward (the reference's conformer without macaron or convolution)."""

    def __init__(self, size: int, heads: int, hidden: int):
        super().__init__()
        self.self_attn, self.feed_forward = RelPositionAttention(heads, size), FeedForward(size, hidden)
        self.norm_ff, self.norm_mha = nn.LayerNorm(size, eps=1e-12), nn.LayerNorm(size, eps=1e-12)

    def forward(self, x: torch.Tensor, blocked: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), blocked, pos_emb)
        return x + self.feed_forward(self.norm_ff(x))


class PreLookaheadLayer(nn.Module):
    """Each position reads itself and `pre_lookahead_len` positions after it, then 2 before (causal)."""

    def __init__(self, channels: int, pre_lookahead_len: int):
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        self.conv1 = nn.Conv1d(channels, channels, pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(channels, channels, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T + pre_lookahead_len, C] (each row's look-ahead context, or zeros, after its T positions)
        → [B, T, C]."""
        out = F.leaky_relu(self.conv1(x.transpose(1, 2)))                 # [B, C, T]
        out = self.conv2(F.pad(out, (2, 0))).transpose(1, 2)
        return out + x[:, : out.shape[1]]


class Upsample1D(nn.Module):
    """Nearest ×stride, then a causal convolution over 2·stride + 1 frames."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, channels, stride * 2 + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, C, T] → [B, C, T·stride]."""
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (self.stride * 2, 0)))


class UpsampleConformerEncoder(nn.Module):
    def __init__(self, input_size: int, cfg: EncoderConfig, pre_lookahead_len: int):
        super().__init__()
        d = cfg.output_size
        self.cfg = cfg
        self.embed = LinearEmbed(input_size, d)
        self.pre_lookahead_layer = PreLookaheadLayer(d, pre_lookahead_len)
        self.encoders = nn.ModuleList(ConformerLayer(d, cfg.attention_heads, cfg.linear_units) for _ in range(cfg.num_blocks))
        self.up_layer = Upsample1D(d, cfg.upsample_stride)
        self.up_embed = LinearEmbed(input_size, d)
        self.up_encoders = nn.ModuleList(ConformerLayer(d, cfg.attention_heads, cfg.linear_units)
                                         for _ in range(cfg.num_up_blocks))
        self.after_norm = nn.LayerNorm(d, eps=1e-5)

    def forward(self, xs: torch.Tensor, lengths: torch.Tensor, context_lengths: torch.Tensor,
                streaming: bool) -> torch.Tensor:
        """xs [B, T, input_size]: each row's token embeddings, then its look-ahead context tokens' (context_lengths
        of them; 0 at a stream's end), then zero padding; lengths [B]: the tokens to encode (without context)
        → [B, T·stride, output_size], valid up to lengths·stride."""
        T, lookahead = xs.shape[1], self.pre_lookahead_layer.pre_lookahead_len
        x, _ = self.embed(xs)
        pos = torch.arange(T, device=xs.device)
        read = (pos[None, :] < (lengths + context_lengths)[:, None]).to(x.dtype)[..., None]  # tokens and context
        x = F.pad(x * read, (0, 0, 0, lookahead))          # zeros after each row's context, as it has alone
        x = self.pre_lookahead_layer(x)                    # [B, T, d]
        pos_emb = self.embed.pos_enc(x)[1]
        chunk = self.cfg.static_chunk_size if streaming else 0
        blocked = ~chunk_mask(lengths, T, chunk)[:, None]   # [B, 1, T, T]: made once for every layer
        for layer in self.encoders:
            x = layer(x, blocked, pos_emb)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)  # [B, T·stride, d]
        stride = self.cfg.upsample_stride
        x, pos_emb = self.up_embed(x)
        blocked = ~chunk_mask(lengths * stride, T * stride, chunk * stride)[:, None]
        for layer in self.up_encoders:
            x = layer(x, blocked, pos_emb)
        return self.after_norm(x)
