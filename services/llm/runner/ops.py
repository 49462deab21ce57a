"""The handful of fused operations a layer of the kernel runner needs, in two implementations:

- `TritonOps`: the Triton kernels in runner/kernels/ (CUDA; on CPU in Triton's interpreter for tests);
- `TorchOps`: the same contracts in plain PyTorch, built from model.py's reference pieces, so that the
  runner's packing, slot mapping and bucketing run on any device and are held to the reference model.

Contracts (N packed rows, H heads, KH kv heads, D head_dim, pool [blocks, layers, 2, KH, block, D]):
    rms_norm(x [N, C], w [C], eps, residual=None)          → out, or (out, residual) with residual += x
    qk_norm_rope_store(qkv [N, (H+2KH)·D], ...)             → q [N, H, D]; K/V stored at slot_mapping
    silu_mul(gate_up [N, 2I])                               → [N, I]
    decode_attention(q [B, H, D], layer, block_tables [B, max_blocks], context_lens [B])      → [B, H, D]
    prefill_attention(q [N, H, D], layer, block_tables [S, max_blocks], cu_seqlens_q [S+1],
                      context_lens [S])                                                       → [N, H, D]
        (sequences with no rows and rows after cu_seqlens_q[S] are padding: their outputs are unspecified)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.llm.model.config import MossSpeechConfig
from services.llm.model.model import causal_attention, rotate_neox


class TritonOps:
    def __init__(self, cfg: MossSpeechConfig, max_model_len: int, device: torch.device):
        from services.llm.runner.kernels import fused, paged_attention

        self.fused, self.attention = fused, paged_attention
        self.cfg, self.max_model_len = cfg, max_model_len
        self.cos_sin = fused.rope_cache(cfg.head_dim, max_model_len, cfg.rope_theta, device)  # [positions, D/2, 2]
        self.scale = cfg.head_dim ** -0.5

    def rms_norm(self, x, weight, residual=None):
        return self.fused.rms_norm(x, weight, self.cfg.rms_norm_eps, residual=residual)

    def qk_norm_rope_store(self, qkv, q_norm, k_norm, positions, kv_cache, layer, slot_mapping):
        c = self.cfg
        return self.fused.qk_norm_rope_store(qkv, q_norm, k_norm, c.rms_norm_eps, positions, self.cos_sin, kv_cache, layer,
                                             slot_mapping, c.num_attention_heads, c.num_key_value_heads, c.head_dim)

    def silu_mul(self, gate_up):
        return self.fused.silu_mul(gate_up)

    def decode_attention(self, q, kv_cache, layer, block_tables, context_lens):
        return self.attention.paged_decode_attention(q, kv_cache, layer, block_tables, context_lens, self.scale)

    def prefill_attention(self, q, kv_cache, layer, block_tables, cu_seqlens_q, context_lens):
        return self.attention.paged_prefill_attention(q, kv_cache, layer, block_tables, cu_seqlens_q, context_lens,
                                                      self.scale)


class TorchOps:
    """Reference implementations (host-synchronising where convenient: never captured in a graph)."""

    def __init__(self, cfg: MossSpeechConfig, max_model_len: int, device: torch.device):
        self.cfg = cfg

    def _norm(self, x, weight):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
        return (x32 * weight.float()).to(x.dtype)

    def rms_norm(self, x, weight, residual=None):
        if residual is None:
            return self._norm(x, weight)
        residual.copy_(x + residual)
        return self._norm(residual, weight), residual

    def qk_norm_rope_store(self, qkv, q_norm, k_norm, positions, kv_cache, layer, slot_mapping):
        c = self.cfg
        n, h, kh, d = qkv.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q, k, v = qkv.split([h * d, kh * d, kh * d], dim=1)
        q = rotate_neox(self._norm(q.reshape(n, h, d), q_norm), positions, c.rope_theta)
        k = rotate_neox(self._norm(k.reshape(n, kh, d), k_norm), positions, c.rope_theta)
        keep = slot_mapping >= 0
        slots, block = slot_mapping[keep], kv_cache.shape[4]
        kv_cache[slots // block, layer, 0, :, slots % block] = k[keep]
        kv_cache[slots // block, layer, 1, :, slots % block] = v.reshape(n, kh, d)[keep]
        return q

    def silu_mul(self, gate_up):
        gate, up = gate_up.chunk(2, dim=1)
        return F.silu(gate) * up

    @staticmethod
    def _context(kv_cache, layer, table, ctx):
        """One sequence's first ctx positions of K and V: [ctx, KH, D] each."""
        block = kv_cache.shape[4]
        used = table[: -(-ctx // block)].long()
        k = kv_cache[used, layer, 0].permute(0, 2, 1, 3).flatten(0, 1)[:ctx]
        v = kv_cache[used, layer, 1].permute(0, 2, 1, 3).flatten(0, 1)[:ctx]
        return k, v

    def decode_attention(self, q, kv_cache, layer, block_tables, context_lens):
        out = torch.zeros_like(q)
        for b, ctx in enumerate(context_lens.tolist()):
            if ctx:
                k, v = self._context(kv_cache, layer, block_tables[b], ctx)
                out[b : b + 1] = causal_attention(q[b : b + 1], k, v, start=ctx - 1)
        return out

    def prefill_attention(self, q, kv_cache, layer, block_tables, cu_seqlens_q, context_lens):
        out = torch.zeros_like(q)
        cu = cu_seqlens_q.tolist()
        for s, ctx in enumerate(context_lens.tolist()):
            rows = slice(cu[s], cu[s + 1])
            if cu[s + 1] == cu[s]:
                continue
            k, v = self._context(kv_cache, layer, block_tables[s], ctx)
            out[rows] = causal_attention(q[rows], k, v, start=ctx - (cu[s + 1] - cu[s]))
        return out


def make_ops(kind: str, cfg: MossSpeechConfig, max_model_len: int, device: torch.device):
    return {"triton": TritonOps, "torch": TorchOps}[kind](cfg, max_model_len, device)
