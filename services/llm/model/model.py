"""MOSS-Speech in PyTorch: a Qwen3 trunk shared by a text branch and an audio branch.

Module names reproduce the published weight keys (`model.shared_block.layers.N.self_attn.q_proj.weight`,
`text_lm_head.weight`, ...), so a HF-format checkpoint loads with a plain `load_state_dict`.

Attention is delegated to an `AttentionBackend` so that one model serves both the dense reference
(`DenseAttention`, used by tests) and the paged KV cache of the model runner. Layers are numbered for
the KV cache in one sequence: shared 0..S-1, text branch S..S+M-1, audio branch S+M..S+2M-1.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from services.llm.model.config import MossSpeechConfig


class AttentionBackend(Protocol):
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [n, heads, head_dim], k/v [n, kv_heads, head_dim] for the n new positions → [n, heads, head_dim]."""


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Causal GQA attention of n new queries at positions start..start+n-1 over ctx cached keys.

    q [n, heads, d]; k, v [ctx, kv_heads, d] with ctx = start + n → [n, heads, d].
    """
    n, heads, _ = q.shape
    ctx, kv_heads, _ = k.shape
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    q_pos = torch.arange(start, start + n, device=q.device)[:, None]
    mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos  # [n, ctx]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    )  # [heads, n, d]
    return out.transpose(0, 1)


class DenseAttention:
    """No cache: attention over exactly the positions given (one full forward)."""

    def attend(self, layer, q, k, v):
        return causal_attention(q, k, v, start=0)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rotate_neox(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX-style RoPE: x [n, heads, d] rotated by halves at `positions` [n]."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv_freq[None, :]  # [n, d/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
    x32 = x.float()
    x1, x2 = x32[..., : d // 2], x32[..., d // 2 :]
    rotated = torch.cat([-x2, x1], -1)
    return (x32 * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: MossSpeechConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x, positions, attn: AttentionBackend, layer: int):
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(n, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        q, k = rotate_neox(q, positions, self.theta), rotate_neox(k, positions, self.theta)
        return self.o_proj(attn.attend(layer, q, k, v).reshape(n, -1))


class MLP(nn.Module):
    def __init__(self, cfg: MossSpeechConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: MossSpeechConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, positions, attn, layer):
        x = x + self.self_attn(self.input_layernorm(x), positions, attn, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Block(nn.Module):
    """A stack of decoder layers whose KV-cache layer ids start at `first_layer`."""

    def __init__(self, cfg: MossSpeechConfig, num_layers: int, first_layer: int):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(num_layers))
        self.first_layer = first_layer

    def forward(self, x, positions, attn):
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, attn, self.first_layer + i)
        return x


class MossSpeechModel(nn.Module):
    def __init__(self, cfg: MossSpeechConfig):
        super().__init__()
        self.cfg = cfg
        s, m = cfg.num_shared_layers, cfg.num_modality_layers
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.audio_embed = nn.Embedding(cfg.audio_vocab_size, cfg.hidden_size)
        self.shared_block = Block(cfg, s, first_layer=0)
        self.text_block = Block(cfg, m, first_layer=s)
        self.audio_block = Block(cfg, m, first_layer=s + m)
        self.text_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.audio_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def embed(self, text_ids: torch.Tensor, audio_ids: torch.Tensor) -> torch.Tensor:
        """[n] + [n] → [n, hidden]: the audio embedding where the text channel holds modality_pad."""
        use_audio = text_ids == self.cfg.modality_pad_token_id
        text = self.embed_tokens(torch.where(use_audio, 0, text_ids))
        audio = self.audio_embed(torch.where(use_audio, audio_ids, 0))
        return torch.where(use_audio[:, None], audio, text)

    def forward(self, text_ids, audio_ids, positions, attn: AttentionBackend):
        """→ (text hidden [n, hidden], audio hidden [n, hidden]), each after its branch's final norm."""
        h = self.shared_block(self.embed(text_ids, audio_ids), positions, attn)
        text = self.text_norm(self.text_block(h, positions, attn))
        audio = self.audio_norm(self.audio_block(h, positions, attn))
        return text, audio


class MossSpeechForCausalLM(nn.Module):
    def __init__(self, cfg: MossSpeechConfig):
        super().__init__()
        self.cfg = cfg
        self.model = MossSpeechModel(cfg)
        self.text_lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.audio_lm_head = nn.Linear(cfg.hidden_size, cfg.audio_vocab_size, bias=False)

    @torch.inference_mode()
    def forward(self, text_ids, audio_ids, positions, attn: AttentionBackend | None = None, rows=None,
                text_rows=None, audio_rows=None):
        """One sequence's positions [n] (both channels) → (text logits, audio logits), float32.

        `rows` selects the positions whose logits are wanted from both heads (default: all) — a prefill
        needs only its last row, and skipping the rest saves n × (151680 + 16512) × hidden multiply-adds.
        `text_rows` / `audio_rows`, when given, select rows per head instead: a sequence in audio mode
        samples only the audio head, one in text mode only the text head (1.24 GB of text head weights
        not read in an audio step).
        """
        text, audio = self.model(text_ids, audio_ids, positions, attn or DenseAttention())
        if text_rows is not None or audio_rows is not None:
            return self.heads(text, audio, text_rows, audio_rows)
        if rows is not None:
            text, audio = text[rows], audio[rows]
        return self.text_lm_head(text).float(), self.audio_lm_head(audio).float()

    def heads(self, text, audio, text_rows, audio_rows):
        """Final hidden states [n, hidden] of each branch → (text logits [T, V], audio logits [A, V_audio])
        for the selected rows (an empty selection gives an empty [0, V] tensor and reads no weights)."""
        def head(linear, hidden, rows):
            if rows is None or len(rows) == 0:
                return hidden.new_zeros(0, linear.out_features, dtype=torch.float32)
            return linear(hidden[rows]).float()

        return head(self.text_lm_head, text, text_rows), head(self.audio_lm_head, audio, audio_rows)
