"""The flow's conformer encoder (codec/conformer.py): its relative-position attention against the formula written
plainly (ESPnet's, as the reference computes it), with chunk masks that leave a row no key; and the whole encoder in
bf16 on the same inputs, batched rows against each alone."""

from __future__ import annotations

import math

import pytest
import torch

from services.vocoder.codec.conformer import RelPositionalEncoding, RelPositionAttention, chunk_mask


def plain(att: RelPositionAttention, x: torch.Tensor, mask: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
    """x [B, T, d], mask bool [B, T, T], pos_emb [1, 2T-1, d] → [B, T, d]: softmax((q+u)·k + (q+v)·p_{i-j}) / √d_k
    over the keys a query may read (a row with none: zeros), one product at a time."""
    B, T, _ = x.shape
    h, d = att.h, att.d_k
    q = att.linear_q(x).view(B, T, h, d)
    k = att.linear_k(x).view(B, T, h, d).transpose(1, 2)
    v = att.linear_v(x).view(B, T, h, d).transpose(1, 2)
    p = att.linear_pos(pos_emb).view(1, -1, h, d).transpose(1, 2)
    content = (q + att.pos_bias_u).transpose(1, 2) @ k.transpose(-2, -1)
    position = (q + att.pos_bias_v).transpose(1, 2) @ p.transpose(-2, -1)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    position = position.gather(-1, (T - 1 - i + j).expand(B, h, T, T))
    scores = (content + position) / math.sqrt(d)
    blocked = ~mask[:, None]
    attn = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1).masked_fill(blocked, 0.0)
    return att.linear_out((attn @ v).transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("heads, width", [(8, 512), (4, 512)])  # d_k 64 (the real size's) and 128 (tiny's)
def test_relative_position_attention_is_the_plain_formula(heads, width):
    torch.manual_seed(0)
    att = RelPositionAttention(heads, width).eval()
    with torch.no_grad():
        att.pos_bias_u.normal_()
        att.pos_bias_v.normal_()
    B, T = 3, 23
    x = torch.randn(B, T, width)
    lengths = torch.tensor([23, 9, 0])                      # a full row, a short one, and one with no key at all
    mask = chunk_mask(lengths, T, 5)
    pos_emb = RelPositionalEncoding(width)(x)[1]
    with torch.no_grad():
        got, want = att(x, ~mask[:, None], pos_emb), plain(att, x, mask, pos_emb)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert torch.isfinite(got).all()


def test_the_fused_qkv_weights_follow_a_load():
    att = RelPositionAttention(4, 64)
    state = {k: torch.randn_like(v) for k, v in att.state_dict().items()}
    att.load_state_dict(state)
    torch.testing.assert_close(att.qkv_weight, torch.cat([state[f"linear_{n}.weight"] for n in "qkv"]), atol=0, rtol=0)
    torch.testing.assert_close(att.qkv_bias, torch.cat([state[f"linear_{n}.bias"] for n in "qkv"]), atol=0, rtol=0)
    assert "qkv_weight" not in att.state_dict()             # (the reference's names only)


def test_the_encoders_rows_batched_are_each_alone_in_bf16():
    from services.vocoder.codec.checkpoint import random_codec
    from services.vocoder.codec.config import tiny

    flow = random_codec(tiny(), 0)[0].to(torch.bfloat16)
    tokens = torch.randint(0, 1000, (2, 16))
    lengths, context = torch.tensor([16, 11]), torch.tensor([0, 3])
    with torch.no_grad():
        x = flow.input_embedding(tokens)
        both = flow.encoder(x, lengths, context, True)
        for b in range(2):
            alone = flow.encoder(x[b : b + 1], lengths[b : b + 1], context[b : b + 1], True)
            n = int(lengths[b]) * 4
            torch.testing.assert_close(both[b, :n].float(), alone[0, :n].float(), atol=1e-2, rtol=1e-2)
