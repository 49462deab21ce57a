"""Runs the model over a scheduled batch with a paged KV cache.

One preallocated pool in TensorRT-LLM's layout (docs/architecture.md §3):
    kv_cache [num_blocks, num_layers, 2, kv_heads, block_size, head_dim]   (2: K then V)
Position p of a sequence lives in block block_table[p // block_size] at offset p % block_size; all
40 layers share the sequence's one block table.

A batch is packed without padding: the new positions of every scheduled sequence, prefill chunks and
single decode positions alike, form one row of N tokens, so every projection and MLP is one GEMM over
N rows. Attention is the clear reference: per sequence, over the blocks it owns. This runner is the CPU
default and the tests' oracle; on CUDA the kernel runner (kernel_runner.py: Triton paged attention, CUDA graphs)
serves.
"""

from __future__ import annotations

import torch

from services.llm.batch import ScheduledBatch
from services.llm.model.model import MossSpeechForCausalLM, causal_attention
from services.llm.sequence import Mode


class PagedAttention:
    """AttentionBackend for a packed batch: write the new K/V into the pool, attend per sequence.

    block_ids/offsets [N]: where each new position's K/V goes. segments: per sequence
    (first row in the batch, rows, position of the first row, its block table as a tensor)."""

    def __init__(self, kv_cache, block_ids, offsets, segments):
        self.kv = kv_cache
        self.block_ids, self.offsets = block_ids, offsets
        self.segments = segments

    def attend(self, layer, q, k, v):
        """q [N, heads, d], k/v [N, kv_heads, d] → [N, heads, d]."""
        self.kv[self.block_ids, layer, 0, :, self.offsets] = k
        self.kv[self.block_ids, layer, 1, :, self.offsets] = v
        out = torch.empty_like(q)
        for row, n, start, table in self.segments:
            end = start + n
            used = table[: -(-end // self.kv.shape[4])]
            # [blocks, kv_heads, block_size, d] → [blocks * block_size, kv_heads, d] → first `end` positions
            k_all = self.kv[used, layer, 0].permute(0, 2, 1, 3).flatten(0, 1)[:end]
            v_all = self.kv[used, layer, 1].permute(0, 2, 1, 3).flatten(0, 1)[:end]
            out[row : row + n] = causal_attention(q[row : row + n], k_all, v_all, start=start)
        return out


class ModelRunner:
    def __init__(self, model: MossSpeechForCausalLM, num_blocks: int, block_size: int, device: torch.device):
        cfg = model.cfg
        self.model = model
        self.device = device
        self.block_size = block_size
        dtype = next(model.parameters()).dtype
        self.kv_cache = torch.zeros(
            num_blocks, cfg.num_layers, 2, cfg.num_key_value_heads, block_size, cfg.head_dim, dtype=dtype, device=device
        )

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy each (source, destination) block's K/V, every layer (a sequence starting with a known partial block:
        block_manager.py), ahead of the step that writes the rest of the destination."""
        source, destination = (torch.tensor(ids, device=self.device) for ids in zip(*copies))
        self.kv_cache[destination] = self.kv_cache[source]

    def run(self, batch: ScheduledBatch, feed: tuple[torch.Tensor, torch.Tensor] | None = None
            ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Compute the scheduled positions; → (indices into batch.seqs of the sequences whose last
        position was computed — they sample next —, text logits [T, V] of those in text mode, audio
        logits [A, V_audio] of those in audio mode, each in batch order).

        feed: (text ids [B], audio ids [B]) on the device for a decode step launched ahead (one position
        per sequence, at num_cached == len(seq): the previous step's samples, not on the host yet)."""
        text, audio, positions, segments, text_rows, audio_rows, sampled = [], [], [], [], [], [], []
        row = 0
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_tokens)):
            start = seq.num_cached
            if feed is None:
                text += seq.text_ids[start : start + n]
                audio += seq.audio_ids[start : start + n]
            positions += range(start, start + n)
            table = torch.tensor(seq.block_table, dtype=torch.long, device=self.device)
            segments.append((row, n, start, table))
            row += n
            if start + n == len(seq) or feed is not None:
                sampled.append(i)
                (text_rows if seq.mode is Mode.TEXT else audio_rows).append(row - 1)
        dev = self.device
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        block_ids = torch.cat([table[pos[r : r + n] // self.block_size] for r, n, _, table in segments])
        attn = PagedAttention(self.kv_cache, block_ids, pos % self.block_size, segments)
        text_ids, audio_ids = feed if feed is not None else (torch.tensor(text, device=dev), torch.tensor(audio, device=dev))
        text_logits, audio_logits = self.model(
            text_ids, audio_ids, pos, attn,
            text_rows=torch.tensor(text_rows, dtype=torch.long, device=dev),
            audio_rows=torch.tensor(audio_rows, dtype=torch.long, device=dev),
        )
        for seq, n in zip(batch.seqs, batch.num_tokens):
            seq.record_text_kv(seq.num_cached, n, computed=True)  # both branches, always
            seq.num_cached += n
        return sampled, text_logits, audio_logits
