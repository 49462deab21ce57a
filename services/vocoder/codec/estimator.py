"""The flow's velocity estimator (the reference's `CausalConditionalDecoder`): a 1-D U-Net over mel frames
whose levels are a causal resnet block and transformer blocks, conditioned on the flow time through an MLP.

Input channels: the noisy mel x, the encoder's mu, the speaker embedding (repeated over time) and the prompt
mel cond (zeros after the prompt), 4 × 80. Convolutions are causal (left-padded) and the norms per frame,
so with static-chunk attention (streaming) a frame depends on its own chunk and the chunks before it only.
Module and parameter names are the reference's (`time_mlp.linear_1`, `down_blocks.0.0.block1.block.0`,
`down_blocks.0.1.0.attn1.to_q`, `final_proj`, ...). One U-Net level, the published estimator's (a level of
strided convolutions would read frames ahead, and nothing here supports it: refused at build).

Layout: activations are [B, T, C] (frames, then channels) from end to end, where the reference's are [B, C, T]:
the transformer blocks and the per-frame LayerNorms want rows of channels, and a causal convolution is then one
matrix product over each frame with the frames before it (unfolded), so nothing changes layout between the
blocks. On an H100 the reference's layout spent more time transposing, normalising transposed rows and in
elementwise kernels over strided tensors than in its matrix products (docs/benchmarks.md).

Kernels: what lies between two matrix products is one kernel (frame_ops.py): a resnet block's norm, Mish and time
term; a residual with the next block's LayerNorm; the feed-forward's GELU runs in its first product's kernel. The
products at a stream's few frames load their weights before the launch wait (prefetch_linear.py), and there a
transformer block's norms, residuals and kept keys run inside its products (`BasicTransformerBlock.folded`: five
kernels, not seven), a causal convolution's product reads its taps itself (prefetch_linear.causal_conv), and a
resnet block's res_conv is its first convolution's product; above, cuBLAS's (with fused_linear.py's GELU).

The reference's masks are left out: every convolution is causal and the attention reads a row's valid frames only,
so a padding frame never reaches a valid one; the solver zeroes the velocity past them (frame_ops.euler_step). The
time terms do not depend on the frames at all: they are computed for every Euler step at once (`time_terms`), not in
each step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from services.vocoder.codec import megakernel, prefetch_linear
from services.vocoder.codec.chunk_attention import chunk_attention
from services.vocoder.codec.config import EstimatorConfig
from services.vocoder.codec.frame_ops import frame_norm, taps_weight
from services.vocoder.codec.prefetch_linear import causal_conv, linear


def laid_out(module: nn.Module, name: str, make) -> None:
    """A weight in the layout the kernels read, `make()` of the module's parameters: a buffer made once, not in every
    call, and again after every load. Not in the state dict: the reference's names load as usual."""
    module.register_buffer(name, make().detach(), persistent=False)
    module.register_load_state_dict_post_hook(lambda m, _: setattr(m, name, make().detach()))


class CausalConv1d(nn.Conv1d):
    """A left-padded convolution over frames, on [B, T, Cin] → [B, T, Cout] (weights as nn.Conv1d's). With a
    prompt prefix (prefix.py) the frames before T's first are the prefix's last, not zeros."""

    slot = 0  # its place among the estimator's causal convolutions (prefix.py keeps one state each)

    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__(cin, cout, kernel)
        laid_out(self, "taps", lambda: taps_weight(self.weight))  # [Cout, k·Cin], the order causal_unfold lays frames out

    def forward(self, x: torch.Tensor, prefix=None, taps: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """taps, bias: other weights laid out as `taps` (more output channels) in place of this convolution's."""
        k = self.kernel_size[0]
        left = None if prefix is None else prefix.left(self.slot, x, k - 1)
        return causal_conv(x, self.taps if taps is None else taps, self.bias if bias is None else bias, k, left)


def pointwise(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """A kernel-1 nn.Conv1d applied to [B, T, Cin] → [B, T, Cout]."""
    return linear(x, conv.weight[:, :, 0], conv.bias)


class CausalBlock1D(nn.Module):
    """Causal conv → LayerNorm over channels → Mish (`block.0` conv, `block.2` norm; 1 and 3 are the reference's
    transposes, not needed in this layout)."""

    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), nn.Identity(), nn.LayerNorm(dim_out), nn.Identity(),
                                   nn.Mish())

    def forward(self, x: torch.Tensor, prefix=None, rows=None, residual=None, then=None):
        """x [B, T, dim] → mish(norm(conv(x))) + rows + residual [B, T, dim_out], and then() of it if given
        (frame_ops.frame_norm: one kernel after the convolution's product)."""
        return self.activate(self.block[0](x, prefix), rows, residual, then)

    def activate(self, h: torch.Tensor, rows=None, residual=None, then=None):
        """What follows the convolution: h [B, T, dim_out] → mish(norm(h)) + rows + residual."""
        return frame_norm(h, self.block[2], mish=True, rows=rows, residual=residual, then=then)


class CausalResnetBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int, time_emb_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1, self.block2 = CausalBlock1D(dim, dim_out), CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)
        # block1's convolution and res_conv as one product where prefetch_linear's kernel runs: [2·dim_out, 3·dim],
        # res_conv's weight in the columns of the last tap (the frame itself), zeros in the others
        laid_out(self, "taps_and_res", lambda: with_pointwise(self.block1.block[0].weight, self.res_conv.weight))
        laid_out(self, "bias_and_res", lambda: torch.cat([self.block1.block[0].bias, self.res_conv.bias]))

    def forward(self, x: torch.Tensor, time_term: torch.Tensor, prefix=None, then=None):
        """x [B, T, dim]; time_term [1 or B, dim_out]: this block's mlp of the time embedding (time_terms) →
        block2(block1(x) + time_term) + res_conv(x) [B, T, dim_out], and then() of it if given."""
        conv1 = self.block1.block[0]
        if prefetch_linear.FOLD and prefetch_linear.runs(x, conv1.kernel_size[0] * x.shape[-1]):  # one product
            h, residual = conv1(x, prefix, self.taps_and_res, self.bias_and_res).chunk(2, dim=-1)
            out = self.block1.activate(h, rows=time_term)
        else:
            residual = pointwise(self.res_conv, x)
            out = self.block1(x, prefix, rows=time_term)
        return self.block2(out, prefix, residual=residual, then=then)


def with_pointwise(weight: torch.Tensor, pointwise_weight: torch.Tensor) -> torch.Tensor:
    """A causal convolution's weight [Cout, Cin, k] and a kernel-1 one's [Cout2, Cin, 1] of the same frames → the taps
    of both [Cout + Cout2, k·Cin] (taps_weight's layout): the second's in the last tap's columns (the frame itself)."""
    k, cin = weight.shape[2], weight.shape[1]
    extra = torch.zeros(pointwise_weight.shape[0], k * cin, dtype=weight.dtype, device=weight.device)
    extra[:, (k - 1) * cin :] = pointwise_weight[:, :, 0]
    return torch.cat([taps_weight(weight), extra])


class GELU(nn.Module):
    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.proj.weight, self.proj.bias, gelu=True)  # (one kernel on CUDA)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.net = nn.ModuleList([GELU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gelu, _, out = self.net  # (the dropout: p = 0, the reference's slot)
        return linear(gelu(x), out.weight, out.bias)


class Attention(nn.Module):
    slot = 0  # its place among the estimator's attentions (prefix.py keeps their keys and values)

    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, inner, bias=False) for _ in range(3))
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])
        # q, k and v as one matrix product: their weights stacked [3·inner, dim]
        laid_out(self, "qkv_weight", lambda: torch.cat([self.to_q.weight, self.to_k.weight, self.to_v.weight]))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, chunk: int, prefix=None):
        """x [B, T, dim]; lengths [B]: each row's valid frames (keys past them are not read); chunk: static-chunk
        frames (0: none); prefix: a prompt prefix, or a stream history, read before the row's keys (prefix.py,
        history.py) → ([B, T, dim], what the next per-frame kernel keeps of k and v: frame_ops.frame_norm's `keep`,
        or None)."""
        attended, keep = self.attend(x, lengths, chunk, prefix)
        out = self.to_out[0]
        return linear(attended, out.weight, out.bias), keep

    def attend(self, x: torch.Tensor, lengths: torch.Tensor, chunk: int, prefix=None, norm: nn.LayerNorm | None = None):
        """As forward, before the output product: → ([B, T, heads·d], keep). q, k and v in one matrix product (of
        norm(x) with `norm`, inside it: prefetch_linear.linear)."""
        B, T, _ = x.shape
        qkv = linear(x, self.qkv_weight, norm=norm)
        q, k, v = qkv.view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # [B, heads, T, d] each
        before = {} if prefix is None else prefix.kv(self.slot, k, v)
        keep = None if prefix is None else prefix.keep(self.slot, k, v)
        return chunk_attention(q, k, v, lengths, chunk, **before), keep


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.norm1, self.norm3 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, dim_head)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, normed: torch.Tensor, lengths: torch.Tensor, chunk: int, prefix=None,
                then=None):
        """x [B, T, dim] and normed = norm1(x) (made by the kernel that made x) → x + attention + feed-forward
        [B, T, dim], and then() of it if given (the next block's norm1)."""
        attended, keep = self.attn1(normed, lengths, chunk, prefix)
        x, normed = frame_norm(attended, residual=x, then=self.norm3, keep=keep)
        return frame_norm(self.ff(normed), residual=x, then=then)

    def folded(self, x: torch.Tensor, lengths: torch.Tensor, chunk: int, prefix=None) -> torch.Tensor:
        """forward's math in five kernels where prefetch_linear's kernel runs, no per-frame kernel between: norm1
        inside q|k|v's product, the residual and the kept keys inside the output product, norm3 inside the
        feed-forward's first, the residual inside its second. x [B, T, dim] → [B, T, dim]."""
        attended, keep = self.attn1.attend(x, lengths, chunk, prefix, norm=self.norm1)
        out = self.attn1.to_out[0]
        x = linear(attended, out.weight, out.bias, residual=x, keep=keep)
        gelu, _, ff_out = self.ff.net
        return linear(linear(x, gelu.proj.weight, gelu.proj.bias, gelu=True, norm=self.norm3), ff_out.weight,
                      ff_out.bias, residual=x)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.in_channels = in_channels
        self.linear_1, self.linear_2 = nn.Linear(in_channels, dim), nn.Linear(dim, dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t [S] in [0, 1] → [S, dim]: sinusoids of 1000·t (Grad-TTS's), then an MLP."""
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
        if len(cfg.channels) != 1:
            raise ValueError(f"estimator: channels {list(cfg.channels)}: one U-Net level is supported (the published "
                             f"estimator's, e.g. [256]); a strided level would read frames ahead of a streamed block")
        self.cfg = cfg
        ch = cfg.channels[0]
        time_dim = ch * 4
        self.time_mlp = TimestepEmbedding(cfg.in_channels, time_dim)
        self.down_blocks = nn.ModuleList([nn.ModuleList([CausalResnetBlock1D(cfg.in_channels, ch, time_dim),
                                                         _transformers(ch, cfg), CausalConv1d(ch, ch, 3)])])
        self.mid_blocks = nn.ModuleList(nn.ModuleList([CausalResnetBlock1D(ch, ch, time_dim), _transformers(ch, cfg)])
                                        for _ in range(cfg.num_mid_blocks))
        self.up_blocks = nn.ModuleList([nn.ModuleList([CausalResnetBlock1D(2 * ch, ch, time_dim), _transformers(ch, cfg),
                                                       CausalConv1d(ch, ch, 3)])])
        self.final_block = CausalBlock1D(ch, ch)
        self.final_proj = nn.Conv1d(ch, cfg.out_channels, 1)
        for kind in (Attention, CausalConv1d):
            for slot, module in enumerate(m for m in self.modules() if isinstance(m, kind)):
                module.slot = slot
        self.transformer_blocks = tuple(self.slots(BasicTransformerBlock))  # in slot order (megakernel.py's runs)

    def slots(self, kind: type) -> list[nn.Module]:
        """The estimator's attentions or causal convolutions, in slot order."""
        return [m for m in self.modules() if isinstance(m, kind)]

    def time_terms(self, t: torch.Tensor) -> torch.Tensor:
        """t [S] flow times → [S, R, C]: each of the R resnet blocks' time term (its mlp of the time embedding) at
        each time. They depend on t alone: one small batch per flow call, not R products in every Euler step."""
        emb = F.mish(self.time_mlp(t))
        return torch.stack([F.linear(emb, r.mlp[1].weight, r.mlp[1].bias) for r in self.slots(CausalResnetBlock1D)], 1)

    def forward(self, h: torch.Tensor, lengths: torch.Tensor, time_terms: torch.Tensor, streaming: bool = False,
                prefix=None) -> torch.Tensor:
        """h [B, T, in_channels]: x | mu | speaker | cond; lengths [B] int32: each row's valid frames;
        time_terms [1 or B, R, C]: time_terms() of the rows' flow time → the velocity [B, T, out_channels], valid
        over each row's frames (past them it is not zeroed: the solver does that).

        prefix (prefix.py; streaming): the frames are those after a prompt prefix whose attention keys and values
        and convolution inputs it holds; or, recording, it keeps the frames' own."""
        chunk = self.cfg.static_chunk_size if streaming else 0
        terms = iter(time_terms.unbind(1))
        ch = self.cfg.channels[0]
        fold = (prefetch_linear.FOLD and prefetch_linear.runs(h, ch) and ch <= prefetch_linear.K_CHUNK
                and not megakernel.ENABLED)

        def level(resnet, blocks, x):
            term = next(terms)
            if fold:  # (the blocks norm their own inputs)
                x = resnet(x, term, prefix)
                for block in blocks:
                    x = block.folded(x, lengths, chunk, prefix)
                return x
            x, normed = resnet(x, term, prefix, then=blocks[0].norm1) if blocks else (resnet(x, term, prefix), None)
            if blocks and megakernel.usable(x, prefix):  # the level's blocks in one launch
                return megakernel.run_blocks(self.transformer_blocks, blocks[0].attn1.slot, len(blocks), x, normed,
                                             lengths, chunk, prefix)
            for i, block in enumerate(blocks):
                last = i == len(blocks) - 1
                out = block(x, normed, lengths, chunk, prefix, then=None if last else blocks[i + 1].norm1)
                x, normed = (out, None) if last else out
            return x

        (resnet, blocks, down), = self.down_blocks
        skip = level(resnet, blocks, h)
        x = down(skip, prefix)
        for resnet, blocks in self.mid_blocks:
            x = level(resnet, blocks, x)
        (resnet, blocks, up), = self.up_blocks
        x = up(level(resnet, blocks, torch.cat([x, skip], dim=-1)), prefix)
        return pointwise(self.final_proj, self.final_block(x, prefix))
