"""Runs the model over scheduled sequences with a paged KV cache.

One preallocated pool in TensorRT-LLM's layout (shared/DESIGN.md §3):
    kv_cache [num_blocks, num_layers, 2, kv_heads, block_size, head_dim]   (2: K then V)
Position p of a sequence lives in block block_table[p // block_size] at offset p % block_size; all
40 layers share the sequence's one block table.

This is the clear reference implementation: each sequence is its own forward. Packed variable-length
batches, CUDA graphs and a fused attention kernel are later work.
"""

from __future__ import annotations

import torch

from services.llm.model import MossSpeechForCausalLM, causal_attention
from services.llm.sequence import Sequence


class PagedAttention:
    """AttentionBackend that writes the new positions' K/V into the pool and attends over the cache."""

    def __init__(self, kv_cache: torch.Tensor, block_table: list[int], start: int, block_size: int):
        self.kv = kv_cache
        self.start = start
        self.block_size = block_size
        self.blocks = torch.tensor(block_table, dtype=torch.long, device=kv_cache.device)

    def attend(self, layer, q, k, v):
        n = q.shape[0]
        end = self.start + n
        pos = torch.arange(self.start, end, device=q.device)
        block, offset = self.blocks[pos // self.block_size], pos % self.block_size
        self.kv[block, layer, 0, :, offset] = k  # [n, kv_heads, d]
        self.kv[block, layer, 1, :, offset] = v
        used = self.blocks[: -(-end // self.block_size)]
        # [blocks, kv_heads, block_size, d] → [kv_heads, blocks * block_size, d] → [ctx, kv_heads, d]
        k_all = self.kv[used, layer, 0].transpose(0, 1).flatten(1, 2)[:, :end].transpose(0, 1)
        v_all = self.kv[used, layer, 1].transpose(0, 1).flatten(1, 2)[:, :end].transpose(0, 1)
        return causal_attention(q, k_all, v_all, start=self.start)


class ModelRunner:
    def __init__(self, model: MossSpeechForCausalLM, num_blocks: int, block_size: int, device: torch.device):
        cfg = model.cfg
        self.model = model
        self.device = device
        self.block_size = block_size
        dtype = next(model.parameters()).dtype
        self.kv_cache = torch.empty(
            num_blocks, cfg.num_layers, 2, cfg.num_key_value_heads, block_size, cfg.head_dim, dtype=dtype, device=device
        )

    def run(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Process every uncached position of each sequence → last-position logits:
        (text [B, text_vocab], audio [B, audio_vocab]), float32."""
        text_rows, audio_rows = [], []
        for seq in seqs:
            start, end = seq.num_cached, len(seq)
            t = torch.tensor(seq.text_ids[start:end], device=self.device)
            a = torch.tensor(seq.audio_ids[start:end], device=self.device)
            pos = torch.arange(start, end, device=self.device)
            attn = PagedAttention(self.kv_cache, seq.block_table, start, self.block_size)
            text_logits, audio_logits = self.model(t, a, pos, attn, rows=slice(-1, None))
            text_rows.append(text_logits)
            audio_rows.append(audio_logits)
            seq.num_cached = end
        return torch.cat(text_rows), torch.cat(audio_rows)
