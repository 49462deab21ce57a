"""The model's forward over one packed step, built from fused ops (runner/ops.py) and the model's weights.

Per layer: 3 GEMMs' worth of launches less than the reference: q, k and v are one GEMM over a packed
[(H + 2·KH)·D, hidden] weight, gate and up one over [2·I, hidden]. The packed weights are the storage
and the model's own q/k/v/gate/up parameters become views into them, so nothing is held twice and the
reference model (the test oracle) still reads the same numbers.

With `quantization="fp8"` the four GEMM weights of every layer are kept in FP8 instead (runner/fp8.py), and the
modules' own weights are emptied: a model served in FP8 holds its layers once, and only this runner can run them.

The residual stream is carried as (x, residual) and added inside the next RMSNorm (one kernel for
add + norm). The shared trunk's output feeds both branches: the text branch gets a copy of the residual,
because the fused norm updates it in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.llm.model.model import DecoderLayer, MossSpeechForCausalLM
from services.llm.runner.fp8 import Fp8Weight, linear

QUANTIZATIONS = ("none", "fp8")


def pack_weights(layer: DecoderLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-home q/k/v and gate/up into two packed tensors and make the modules' parameters views of them."""
    a, m = layer.self_attn, layer.mlp
    qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
    gate_up = torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach()
    rows = [a.q_proj.out_features, a.k_proj.out_features, a.v_proj.out_features]
    for module, view in zip((a.q_proj, a.k_proj, a.v_proj), qkv.split(rows)):
        module.weight = torch.nn.Parameter(view, requires_grad=False)
    for module, view in zip((m.gate_proj, m.up_proj), gate_up.chunk(2)):
        module.weight = torch.nn.Parameter(view, requires_grad=False)
    return qkv, gate_up


@dataclass
class LayerWeights:
    layer_id: int          # its index in the KV pool's layer axis
    input_norm: torch.Tensor
    qkv: torch.Tensor | Fp8Weight      # [(H + 2·KH)·D, hidden]
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor | Fp8Weight        # [hidden, H·D]
    post_norm: torch.Tensor
    gate_up: torch.Tensor | Fp8Weight  # [2·I, hidden]
    down: torch.Tensor | Fp8Weight     # [hidden, I]

    @classmethod
    def of(cls, layer: DecoderLayer, layer_id: int, quantization: str = "none") -> "LayerWeights":
        qkv, gate_up = pack_weights(layer)
        a, m = layer.self_attn, layer.mlp
        o, down = a.o_proj.weight, m.down_proj.weight
        if quantization == "fp8":
            qkv, o, gate_up, down = (Fp8Weight.of(w) for w in (qkv, o, gate_up, down))
            empty = a.q_norm.weight.new_empty(0)  # the model's dtype and device: parameters still say what it is
            for module in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
                module.weight = torch.nn.Parameter(empty, requires_grad=False)
        return cls(layer_id, layer.input_layernorm.weight, qkv, a.q_norm.weight, a.k_norm.weight, o,
                   layer.post_attention_layernorm.weight, gate_up, down)


@dataclass
class StepTensors:
    """One step's packed inputs on the device (N rows)."""

    text_ids: torch.Tensor      # [N] int64
    audio_ids: torch.Tensor     # [N] int64
    positions: torch.Tensor     # [N] int64
    slot_mapping: torch.Tensor  # [N] int64: block_id · block_size + offset; -1 for a padding row
    block_tables: torch.Tensor  # [S, max_blocks] int32 (S = N in decode)
    context_lens: torch.Tensor  # [S] int32: positions after this step (0: padding row)
    cu_seqlens_q: torch.Tensor | None = None  # [S+1] int32, packed steps only (None: one row per sequence)


class PackedForward:
    def __init__(self, model: MossSpeechForCausalLM, kv_cache: torch.Tensor, ops, trunk: torch.Tensor | None = None,
                 quantization: str = "none"):
        """trunk: [pool slots + 1, hidden], or None: where each computed position's shared-trunk output
        (the text branch's input) is kept, by KV slot (the last row takes padding rows' writes), so that
        a text branch skipped while speaking can be computed later from it (`text_branch`).
        quantization: "none" (the model's dtype) or "fp8" (the layers' GEMMs: see the module)."""
        self.model, self.kv_cache, self.ops, self.trunk = model, kv_cache, ops, trunk
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantization!r}: {', '.join(QUANTIZATIONS)}")
        m = model.model
        self.shared, self.text, self.audio = (
            [LayerWeights.of(layer, block.first_layer + i, quantization) for i, layer in enumerate(block.layers)]
            for block in (m.shared_block, m.text_block, m.audio_block))
        self.cfg = model.cfg

    def _attend(self, q: torch.Tensor, layer_id: int, t: StepTensors) -> torch.Tensor:
        if t.cu_seqlens_q is None:
            return self.ops.decode_attention(q, self.kv_cache, layer_id, t.block_tables, t.context_lens)
        return self.ops.prefill_attention(q, self.kv_cache, layer_id, t.block_tables, t.cu_seqlens_q, t.context_lens)

    def _layer(self, w: LayerWeights, x: torch.Tensor, residual: torch.Tensor, t: StepTensors):
        """(x, residual) [N, hidden] each, the stream being x + residual → the same after this layer."""
        ops, n = self.ops, x.shape[0]
        h, residual = ops.rms_norm(x, w.input_norm, residual=residual)
        q = ops.qk_norm_rope_store(linear(h, w.qkv), w.q_norm, w.k_norm, t.positions, self.kv_cache, w.layer_id,
                                   t.slot_mapping)
        x = linear(self._attend(q, w.layer_id, t).reshape(n, -1), w.o)
        h, residual = ops.rms_norm(x, w.post_norm, residual=residual)
        return linear(ops.silu_mul(linear(h, w.gate_up)), w.down), residual

    def _branch(self, layers, x, residual, t):
        for w in layers:
            x, residual = self._layer(w, x, residual, t)
        return x, residual

    def __call__(self, t: StepTensors, text: bool = True, audio: bool = True):
        """→ (text stream, audio stream), each (x, residual) [N, hidden] before the branch's final norm;
        a branch not asked for is not computed (None): see `final_hidden`. The trunk output is kept
        (when there is a `trunk`) whichever branches run."""
        x = self.model.model.embed(t.text_ids, t.audio_ids)
        residual = torch.zeros_like(x)
        x, residual = self._branch(self.shared, x, residual, t)
        if self.trunk is not None:
            # The stream x + residual, rounded as the next fused norm rounds it: fed back as (it, 0), the
            # text branch's first norm sees the same numbers.
            last = self.trunk.shape[0] - 1
            self.trunk.index_copy_(0, torch.where(t.slot_mapping < 0, last, t.slot_mapping), x + residual)
        text_out = self._branch(self.text, x, residual.clone(), t) if text else None
        audio_out = self._branch(self.audio, x, residual, t) if audio else None
        return text_out, audio_out

    def text_branch(self, t: StepTensors) -> None:
        """Compute the text branch's K/V for t's rows (positions whose text branch was skipped) from the
        kept trunk outputs at t.slot_mapping; their outputs are not needed. t.text_ids/audio_ids unused."""
        x = self.trunk[t.slot_mapping]
        self._branch(self.text, x, torch.zeros_like(x), t)

    def final_hidden(self, stream, norm: torch.Tensor, rows: torch.Tensor | slice | None = None) -> torch.Tensor:
        """A branch's (x, residual) → its final-norm hidden states [rows, hidden] for the selected rows."""
        x, residual = stream
        if rows is not None:
            x, residual = x[rows], residual[rows]
        return self.ops.rms_norm(x, norm, residual=residual.clone())[0]  # the stream itself stays as it was
