"""The flow's velocity estimator (the reference's `CausalConditionalDecoder`): a 1-D U-Net over mel frames
whose levels are a causal resnet block and transformer blocks, conditioned on the flow time through an MLP.

Input channels: the noisy mel x, the encoder's mu, the speaker embedding (repeated over time) and the prompt
mel cond (zeros after the prompt), 4 × 80. Convolutions are causal (left-padded) and the norms per frame,
so with static-chunk attention (streaming) a frame depends on its own chunk and the chunks before it only.
Module and parameter names are the reference's (`time_mlp.linear_1`, `down_blocks.0.0.block1.block.0`,
`down_blocks.0.1.0.attn1.to_q`, `final_proj`, ...).

Layout: activations are [B, T, C] (frames, then channels) from end to end, where the reference's are [B, C, T]:
the transformer blocks and the per-frame LayerNorms want rows of channels, and a causal convolution is then one
matrix product over each frame with the frames before it (unfolded), so nothing changes layout between the
blocks. On an H100 the reference's layout spent more time transposing, normalising transposed rows and in
elementwise kernels over strided tensors than in its matrix products (docs/benchmarks.md, issue 20).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from services.vocoder.codec.chunk_attention import chunk_attention
from services.vocoder.codec.config import EstimatorConfig


class CausalConv1d(nn.Conv1d):
    """A left-padded convolution over frames, on [B, T, Cin] → [B, T, Cout] (weights as nn.Conv1d's). With a
    prompt prefix (prefix.py) the frames before T's first are the prefix's last, not zeros."""

    slot = 0  # its place among the estimator's causal convolutions (prefix.py keeps one state each)

    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__(cin, cout, kernel)

    def forward(self, x: torch.Tensor, prefix=None) -> torch.Tensor:
        k = self.kernel_size[0]
        padded = F.pad(x, (0, 0, k - 1, 0)) if prefix is None else prefix.left(self.slot, x, k - 1)
        cols = padded.unfold(1, k, 1)                                      # [B, T, Cin, k]: frame t-k+1..t
        return F.linear(cols.reshape(*x.shape[:2], -1), self.weight.view(self.out_channels, -1), self.bias)


def pointwise(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """A kernel-1 nn.Conv1d applied to [B, T, Cin] → [B, T, Cout]."""
    return F.linear(x, conv.weight[:, :, 0], conv.bias)


def across_frames(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A strided or transposed convolution (the levels of a multi-level U-Net only) on [B, T, C]."""
    return conv(x.transpose(1, 2)).transpose(1, 2)


class CausalBlock1D(nn.Module):
    """Causal conv → LayerNorm over channels → Mish, zero outside the mask (`block.0` conv, `block.2` norm; 1 and 3
    are the reference's transposes, not needed in this layout)."""

    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), nn.Identity(), nn.LayerNorm(dim_out), nn.Identity(),
                                   nn.Mish())

    def forward(self, x: torch.Tensor, mask: torch.Tensor, prefix=None) -> torch.Tensor:
        """x [B, T, dim], mask [B, T, 1] → [B, T, dim_out]."""
        conv, _, norm, _, mish = self.block
        return mish(norm(conv(x * mask, prefix))) * mask


class CausalResnetBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int, time_emb_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1, self.block2 = CausalBlock1D(dim, dim_out), CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, t: torch.Tensor, prefix=None) -> torch.Tensor:
        """x [B, T, dim], mask [B, T, 1], t [B, time_emb_dim] → [B, T, dim_out]."""
        h = self.block1(x, mask, prefix) + self.mlp(t)[:, None, :]
        return self.block2(h, mask, prefix) + pointwise(self.res_conv, x * mask)


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
    slot = 0  # its place among the estimator's attentions (prefix.py keeps their keys and values)

    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, inner, bias=False) for _ in range(3))
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])
        # q, k and v as one matrix product: their weights stacked [3·inner, dim] once, not in every call. Not in the
        # state dict (the reference's names load into to_q/to_k/to_v); stacked again after every load.
        self.register_buffer("qkv_weight", self._stacked(), persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _: module.restack())

    def _stacked(self) -> torch.Tensor:
        return torch.cat([self.to_q.weight, self.to_k.weight, self.to_v.weight]).detach()

    def restack(self) -> None:
        self.qkv_weight = self._stacked()

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, chunk: int, prefix=None) -> torch.Tensor:
        """x [B, T, dim]; lengths [B]: each row's valid frames (keys past them are not read); chunk: static-chunk
        frames (0: none); prefix: a prompt prefix read before the row's keys (prefix.py) → [B, T, dim]. q, k and
        v in one matrix product."""
        B, T, _ = x.shape
        q, k, v = F.linear(x, self.qkv_weight).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # [B, heads, T, d] each
        before = None if prefix is None else prefix.kv(self.slot, k, v)
        return self.to_out[0](chunk_attention(q, k, v, lengths, chunk, before))


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.norm1, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, chunk: int, prefix=None) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x), lengths, chunk, prefix)
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
        for kind in (Attention, CausalConv1d):
            for slot, module in enumerate(m for m in self.modules() if isinstance(m, kind)):
                module.slot = slot

    def slots(self, kind: type) -> list[nn.Module]:
        """The estimator's attentions or causal convolutions, in slot order."""
        return [m for m in self.modules() if isinstance(m, kind)]

    @property
    def single_level(self) -> bool:
        """One U-Net level (the published estimator's): every convolution causal, so a prompt prefix applies."""
        return len(self.cfg.channels) == 1

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, spks: torch.Tensor,
                cond: torch.Tensor, streaming: bool = False, prefix=None) -> torch.Tensor:
        """x, mu, cond [B, T, 80]; mask [B, T, 1]; t [B]; spks [B, 80] → the velocity [B, T, 80].

        prefix (prefix.py; streaming, single level only): the frames are those after a prompt prefix whose
        attention keys and values and convolution inputs it holds; or, recording, it keeps the frames' own."""
        chunk = self.cfg.static_chunk_size if streaming else 0
        temb = self.time_mlp(t)
        x = torch.cat([x, mu, spks[:, None, :].expand(-1, x.shape[1], -1), cond], dim=-1)
        skips, masks = [], [mask]
        lengths_of = {}  # each row's valid frames at a U-Net level (its frame count): the mask is a row's first frames

        def attend(h, m, blocks):
            if m.shape[1] not in lengths_of:
                lengths_of[m.shape[1]] = m[:, :, 0].sum(1).to(torch.int32)
            lengths = lengths_of[m.shape[1]]
            for block in blocks:
                h = block(h, lengths, chunk, prefix)
            return h

        for resnet, blocks, down in self.down_blocks:
            m = masks[-1]
            x = attend(resnet(x, m, temb, prefix), m, blocks)
            skips.append(x)
            x = down(x * m, prefix) if isinstance(down, CausalConv1d) else across_frames(down, x * m)
            masks.append(m[:, ::2])
        masks.pop()
        m = masks[-1]
        for resnet, blocks in self.mid_blocks:
            x = attend(resnet(x, m, temb, prefix), m, blocks)
        for resnet, blocks, up in self.up_blocks:
            m, skip = masks.pop(), skips.pop()
            x = torch.cat([x[:, : skip.shape[1]], skip], dim=-1)
            x = attend(resnet(x, m, temb, prefix), m, blocks) * m
            x = up(x, prefix) if isinstance(up, CausalConv1d) else across_frames(up, x)
        x = self.final_block(x, m, prefix)
        return pointwise(self.final_proj, x * m) * mask
