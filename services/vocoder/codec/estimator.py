"""The flow's velocity estimator (the reference's `CausalConditionalDecoder`): a 1-D U-Net over mel frames
whose levels are a causal resnet block and transformer blocks, conditioned on the flow time through an MLP.

Input channels: the noisy mel x, the encoder's mu, the speaker embedding (repeated over time) and the prompt
mel cond (zeros after the prompt), 4 × 80. Convolutions are causal (left-padded) and the norms per frame,
so with static-chunk attention (streaming) a frame depends on its own chunk and the chunks before it only.
Module and parameter names are the reference's (`time_mlp.linear_1`, `down_blocks.0.0.block1.block.0`,
`down_blocks.0.1.0.attn1.to_q`, `final_proj`, ...).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from services.vocoder.codec.config import EstimatorConfig

MASKED = -1.0e10  # the reference's additive attention bias for a key a query may not read


class CausalConv1d(nn.Conv1d):
    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__(cin, cout, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


class CausalBlock1D(nn.Module):
    """Causal conv → LayerNorm over channels → Mish, zero outside the mask (`block.0` conv, `block.2` norm)."""

    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), Transpose(), nn.LayerNorm(dim_out), Transpose(), nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.block(x * mask) * mask


class CausalResnetBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int, time_emb_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1, self.block2 = CausalBlock1D(dim, dim_out), CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.block1(x, mask) + self.mlp(t)[:, :, None]
        return self.block2(h, mask) + self.res_conv(x * mask)


class GELU(nn.Module):
    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.net = nn.ModuleList([GELU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.net:
            x = module(x)
        return x


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, inner, bias=False) for _ in range(3))
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x [B, T, dim], bias [B, 1, T, T] (0 or MASKED) → [B, T, dim]."""
        B, T, _ = x.shape
        q, k, v = (proj(x).view(B, T, self.heads, -1).transpose(1, 2) for proj in (self.to_q, self.to_k, self.to_v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.to_out[0](out.transpose(1, 2).reshape(B, T, -1))


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.norm1, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x), bias)
        return x + self.ff(self.norm3(x))


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.in_channels = in_channels
        self.linear_1, self.linear_2 = nn.Linear(in_channels, dim), nn.Linear(dim, dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t [B] in [0, 1] → [B, dim]: sinusoids of 1000·t (Grad-TTS's), then an MLP."""
        half = self.in_channels // 2
        freq = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
        angle = 1000 * t.float()[:, None] * freq[None]
        emb = torch.cat([angle.sin(), angle.cos()], dim=-1).to(t.dtype)
        return self.linear_2(F.silu(self.linear_1(emb)))


def _transformers(dim: int, cfg: EstimatorConfig) -> nn.ModuleList:
    return nn.ModuleList(BasicTransformerBlock(dim, cfg.num_heads, cfg.attention_head_dim) for _ in range(cfg.n_blocks))


class CausalConditionalDecoder(nn.Module):
    def __init__(self, cfg: EstimatorConfig):
        super().__init__()
        self.cfg = cfg
        channels = tuple(cfg.channels)
        time_dim = channels[0] * 4
        self.time_mlp = TimestepEmbedding(cfg.in_channels, time_dim)
        self.down_blocks, self.mid_blocks, self.up_blocks = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        out = cfg.in_channels
        for i, ch in enumerate(channels):
            last = i == len(channels) - 1
            down = CausalConv1d(ch, ch, 3) if last else nn.Conv1d(ch, ch, 3, 2, 1)
            self.down_blocks.append(nn.ModuleList([CausalResnetBlock1D(out, ch, time_dim), _transformers(ch, cfg), down]))
            out = ch
        for _ in range(cfg.num_mid_blocks):
            self.mid_blocks.append(nn.ModuleList([CausalResnetBlock1D(out, out, time_dim), _transformers(out, cfg)]))
        ups = channels[::-1] + (channels[0],)
        for i in range(len(ups) - 1):
            last = i == len(ups) - 2
            up = CausalConv1d(ups[i + 1], ups[i + 1], 3) if last else nn.ConvTranspose1d(ups[i + 1], ups[i + 1], 4, 2, 1)
            self.up_blocks.append(nn.ModuleList([CausalResnetBlock1D(2 * ups[i], ups[i + 1], time_dim),
                                                 _transformers(ups[i + 1], cfg), up]))
        self.final_block = CausalBlock1D(ups[-1], ups[-1])
        self.final_proj = nn.Conv1d(ups[-1], cfg.out_channels, 1)

    def _attend(self, x: torch.Tensor, mask: torch.Tensor, blocks: nn.ModuleList, chunk: int) -> torch.Tensor:
        """x [B, C, T] through transformer blocks; mask [B, 1, T]; chunk: static-chunk frames (0: full)."""
        T = x.shape[-1]
        pos = torch.arange(T, device=x.device)
        allowed = mask.bool().expand(-1, T, -1)                               # [B, T(query), T(key)]
        if chunk > 0:
            allowed = allowed & (pos[None, :] < ((pos // chunk + 1) * chunk)[:, None])[None]
        bias = ((~allowed).to(x.dtype) * MASKED)[:, None]                      # [B, 1, T, T]
        h = x.transpose(1, 2)
        for block in blocks:
            h = block(h, bias)
        return h.transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spks: torch.Tensor,
                cond: torch.Tensor, streaming: bool = False) -> torch.Tensor:
        """x, mu, cond [B, 80, T]; mask [B, 1, T]; t [B]; spks [B, 80] → the velocity [B, 80, T]."""
        chunk = self.cfg.static_chunk_size if streaming else 0
        temb = self.time_mlp(t)
        x = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, x.shape[-1]), cond], dim=1)
        skips, masks = [], [mask]
        for resnet, blocks, down in self.down_blocks:
            m = masks[-1]
            x = self._attend(resnet(x, m, temb), m, blocks, chunk)
            skips.append(x)
            x = down(x * m)
            masks.append(m[:, :, ::2])
        masks.pop()
        m = masks[-1]
        for resnet, blocks in self.mid_blocks:
            x = self._attend(resnet(x, m, temb), m, blocks, chunk)
        for resnet, blocks, up in self.up_blocks:
            m, skip = masks.pop(), skips.pop()
            x = torch.cat([x[:, :, : skip.shape[-1]], skip], dim=1)
            x = up(self._attend(resnet(x, m, temb), m, blocks, chunk) * m)
        x = self.final_block(x, m)
        return self.final_proj(x * m) * mask
