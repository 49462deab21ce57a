"""MOSS-Speech as a TensorRT-LLM network: the model class an engine is built from (trtllm_build.py), reading the checkpoint
that trtllm_checkpoint.py writes. Imported on a build host only (TensorRT-LLM installed); it can not run here.

The same model as model.py: a Qwen3 trunk of S layers, then a text branch and an audio branch of M layers each that both
read the trunk's output, each with its own final RMSNorm and head. What TensorRT-LLM's stock classes do not give:

- one KV pool for all 2M + S attention layers: each layer's `local_layer_idx` (the attention plugin's layer index into
  the pool) is its place in model.py's order, shared 0..S-1, text S..S+M-1, audio S+M..S+2M-1 (kv_layer_plan), and the
  per-layer inputs (host_max_attention_window_sizes, host_kv_cache_pool_mapping) are sized for all of them;
- Qwen3's per-head q/k RMSNorm under grouped-query attention (QKNormQKV);
- two token channels: `audio_input_ids` beside `input_ids`, embedded as model.py's `embed` does;
- two outputs, `logits` and `audio_logits`, each request's last token, in the config's logits_dtype.

Written against TensorRT-LLM's Python API (0.13 to 0.16; the later TensorRT-engine releases as far as read) from its source;
never built here. TP = PP = 1, paged KV, packed input (remove_input_padding) and the GPT attention plugin only; no
quantization, LoRA, prompt tables or speculative decoding.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import tensorrt as trt
from tensorrt_llm._common import default_net
from tensorrt_llm.functional import Tensor, concat, eq, gather_last_token_logits, shape, split, unsqueeze, where
from tensorrt_llm.layers import Attention, AttentionMaskType, ColumnLinear, Embedding, GatedMLP, RmsNorm
from tensorrt_llm.models.modeling_utils import PretrainedConfig, PretrainedModel
from tensorrt_llm.module import Module, ModuleList

from services.llm.model.trtllm_checkpoint import ARCHITECTURE, kv_layer_plan


class MossSpeechTrtConfig(PretrainedConfig):
    """The converter's config.json (trtllm_checkpoint.trtllm_config): TensorRT-LLM's fields, with num_hidden_layers the
    trunk's S, and num_text_layers, num_audio_layers, audio_vocab_size, rotary_base and moss_speech (the token ids) kept
    as attributes by PretrainedConfig."""

    @classmethod
    def from_dict(cls, config: dict) -> "MossSpeechTrtConfig":
        # PretrainedConfig.from_dict looks the class up in TensorRT-LLM's MODEL_MAP, which does not know this one
        return cls(**dict(config))

    @property
    def num_kv_layers(self) -> int:
        return self.num_hidden_layers + self.num_text_layers + self.num_audio_layers


class QKNormQKV(ColumnLinear):
    """Attention's fused q|k|v projection, then Qwen3's RMSNorm of each q and k head (before the plugin's RoPE, as in
    model.py): [N, hidden] → [N, (H + 2·KV)·D].

    Attention(qk_layernorm=True) can not do it in 0.13-0.16: it views qkv as [N, H, 3, D] (per-head interleaved, and
    H == KV only), while our qkv is q rows, then k, then v (GQA: 32 + 8 + 8 heads). Attention calls `self.qkv(x, ...)`
    and hands the result to the plugin, so the norm lives here. The norms are registered on the Attention
    (attention.q_layernorm / k_layernorm, the checkpoint's names); this module holds them in a tuple, unregistered."""

    def __init__(self, config: MossSpeechTrtConfig, norms: tuple[RmsNorm, RmsNorm]):
        heads, kv_heads, self._head_size = config.num_attention_heads, config.num_key_value_heads, config.head_size
        self._heads = [heads, kv_heads, kv_heads]
        super().__init__(config.hidden_size, sum(self._heads) * self._head_size, bias=False, dtype=config.dtype,
                         gather_output=False)
        self._norms = norms

    def forward(self, x, *args, **kwargs):
        qkv = super().forward(x, *args, **kwargs)                       # [N, (H + 2·KV)·D]
        n = shape(qkv, 0)
        q, k, v = split(qkv.view(concat([n, sum(self._heads), self._head_size])), self._heads, dim=1)  # [N, H|KV|KV, D]
        q_norm, k_norm = self._norms
        qkv = concat([q_norm(q), k_norm(k), v], dim=1)                  # [N, H + 2·KV, D]
        return qkv.view(concat([n, sum(self._heads) * self._head_size]))


class MossSpeechDecoderLayer(Module):
    """A Qwen3 layer (model.py's DecoderLayer) whose attention is layer `kv_layer` of the KV pool. hidden [N, hidden]."""

    def __init__(self, config: MossSpeechTrtConfig, kv_layer: int):
        super().__init__()
        dtype, eps, hidden = config.dtype, config.norm_epsilon, config.hidden_size
        self.input_layernorm = RmsNorm(normalized_shape=hidden, eps=eps, dtype=dtype)
        self.attention = Attention(
            local_layer_idx=kv_layer, hidden_size=hidden, attention_head_size=config.head_size,
            num_attention_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
            max_position_embeddings=config.max_position_embeddings, dtype=dtype,
            attention_mask_type=AttentionMaskType.causal, bias=False, dense_bias=False,
            position_embedding_type=config.position_embedding_type, rotary_embedding_base=config.rotary_base)
        self.attention.q_layernorm = RmsNorm(normalized_shape=config.head_size, eps=eps, dtype=dtype)
        self.attention.k_layernorm = RmsNorm(normalized_shape=config.head_size, eps=eps, dtype=dtype)
        self.attention.qkv = QKNormQKV(config, (self.attention.q_layernorm, self.attention.k_layernorm))
        self.post_layernorm = RmsNorm(normalized_shape=hidden, eps=eps, dtype=dtype)
        # GatedMLP computes proj(act(fc(x)) · gate(x)): fc is gate_proj, gate is up_proj (the converter's mapping)
        self.mlp = GatedMLP(hidden_size=hidden, ffn_hidden_size=config.intermediate_size, hidden_act=config.hidden_act,
                            dtype=dtype, bias=False)

    def forward(self, hidden_states, use_cache=False, attention_mask=None, kv_cache_params=None, attention_params=None):
        attention = self.attention(self.input_layernorm(hidden_states), attention_mask=attention_mask, use_cache=use_cache,
                                   kv_cache_params=kv_cache_params, attention_params=attention_params)
        if use_cache:
            attention, _ = attention  # paged KV: the plugin writes the pool in place; no per-layer `present`
        hidden_states = hidden_states + attention
        return hidden_states + self.mlp(self.post_layernorm(hidden_states))


class MossSpeechTransformer(Module):
    """Embeddings, the three layer stacks and the two final norms, under the checkpoint's `transformer.` names."""

    def __init__(self, config: MossSpeechTrtConfig):
        super().__init__()
        dtype, hidden = config.dtype, config.hidden_size
        self.modality_pad_id = int(config.moss_speech["modality_pad_token_id"])
        self.vocab_embedding = Embedding(config.vocab_size, hidden, dtype=dtype)
        self.audio_embedding = Embedding(config.audio_vocab_size, hidden, dtype=dtype)
        plan = kv_layer_plan(config.num_hidden_layers, config.num_text_layers, config.num_audio_layers)
        self.layers = ModuleList([MossSpeechDecoderLayer(config, i) for i in plan["layers"]])
        self.text_layers = ModuleList([MossSpeechDecoderLayer(config, i) for i in plan["text_layers"]])
        self.audio_layers = ModuleList([MossSpeechDecoderLayer(config, i) for i in plan["audio_layers"]])
        self.text_ln_f = RmsNorm(normalized_shape=hidden, eps=config.norm_epsilon, dtype=dtype)
        self.audio_ln_f = RmsNorm(normalized_shape=hidden, eps=config.norm_epsilon, dtype=dtype)

    def embed(self, input_ids: Tensor, audio_input_ids: Tensor) -> Tensor:
        """[N] text ids + [N] audio ids → [N, hidden]: the audio embedding where the text channel holds modality_pad,
        else the text embedding (model.py's embed; each table reads id 0 at the positions it does not serve)."""
        use_audio = eq(input_ids, self.modality_pad_id)                         # [N] bool
        text = self.vocab_embedding(where(use_audio, 0, input_ids))             # [N, hidden]
        audio = self.audio_embedding(where(use_audio, audio_input_ids, 0))      # [N, hidden]
        return where(unsqueeze(use_audio, 1), audio, text)                      # [N, 1] selects whole rows

    @staticmethod
    def run(layers: ModuleList, hidden_states: Tensor, **kwargs) -> Tensor:
        for layer in layers:
            hidden_states = layer(hidden_states, **kwargs)
        return hidden_states


class MossSpeechForCausalLM(PretrainedModel):
    """The engine's network: inputs `input_ids` and `audio_input_ids` [N] int32 (packed, the step's N tokens) and
    TensorRT-LLM's usual GPT-plugin inputs; outputs `logits` [B, vocab] and `audio_logits` [B, audio vocab], the last
    token of each of the B requests (`last_token_ids`: cumulative token counts), in config.logits_dtype."""

    config_class = MossSpeechTrtConfig

    def __init__(self, config: MossSpeechTrtConfig):
        if config.mapping.world_size != 1:
            raise NotImplementedError(f"{ARCHITECTURE}: TP = PP = 1 only (the runner drives rank 0's engine)")
        if config.quantization.quant_algo is not None or config.quantization.kv_cache_quant_algo is not None:
            # quantize() would swap QKNormQKV for a quantized Linear and drop the q/k norm without a word
            raise NotImplementedError(f"{ARCHITECTURE}: quantized checkpoints are not supported by this class")
        super().__init__(config)
        self.transformer = MossSpeechTransformer(config)
        self.lm_head = ColumnLinear(config.hidden_size, config.vocab_size, bias=False, dtype=config.dtype,
                                    gather_output=True)
        self.audio_lm_head = ColumnLinear(config.hidden_size, config.audio_vocab_size, bias=False, dtype=config.dtype,
                                          gather_output=True)
        # RoPE's tables, once for all layers (as DecoderModelForCausalLM does); the plugin rotates NeoX-style by halves
        Attention.create_attention_const_params(self, config)
        self.position_embedding_type = config.position_embedding_type

    @classmethod
    def from_checkpoint(cls, ckpt_dir: str, rank: int | None = None, config: MossSpeechTrtConfig | None = None, **kwargs):
        """As PretrainedModel's, reading config.json with this class's config (not through MODEL_MAP)."""
        if config is None:
            config = MossSpeechTrtConfig.from_json_file(os.path.join(ckpt_dir, "config.json"))
        return super().from_checkpoint(ckpt_dir, rank=rank, config=config, **kwargs)

    def load(self, weights: dict, from_pruned: bool = False):
        """TensorRT-LLM's load refuses a missing tensor but only warns about one it does not use: refuse both, by name."""
        wanted = {name for name, param in self.named_parameters() if not param.is_inited()}
        missing, unexpected = sorted(wanted - set(weights)), sorted(set(weights) - wanted)
        if missing or unexpected:
            raise ValueError(f"{ARCHITECTURE} checkpoint: missing {missing[:5] or 'none'}, unexpected {unexpected[:5] or 'none'}")
        super().load(weights, from_pruned=from_pruned)

    def prepare_inputs(self, *args, **kwargs):
        """TensorRT-LLM's inputs for the builder's arguments, with every per-layer input sized for all the KV layers (the
        base class sizes them by config.num_hidden_layers, the trunk's S here), and `audio_input_ids` [N] int32 with the
        same optimization-profile ranges as `input_ids` (one named dimension: TensorRT checks both lengths agree)."""
        plugins = default_net().plugin_config
        if not (plugins.gpt_attention_plugin and plugins.remove_input_padding and plugins.paged_kv_cache):
            raise ValueError(f"{ARCHITECTURE}: build with the GPT attention plugin, remove_input_padding and paged KV")
        shared = self.config.num_hidden_layers
        self.config.num_hidden_layers = self.config.num_kv_layers
        try:
            inputs = super().prepare_inputs(*args, **kwargs)
        finally:
            self.config.num_hidden_layers = shared
        ranges = [[p.min[0], p.opt[0], p.max[0]] for p in inputs["input_ids"].profiles]
        inputs["audio_input_ids"] = Tensor(name="audio_input_ids", dtype=trt.int32, shape=[-1],
                                           dim_range=OrderedDict([("num_tokens", ranges)]))
        return inputs

    def forward(self, input_ids: Tensor, audio_input_ids: Tensor, position_ids=None, use_cache=False, last_token_ids=None,
                attention_mask=None, kv_cache_params=None, attention_params=None, **unsupported):
        """position_ids is an input the runner sets but nothing reads: the plugin rotates by each token's place in its
        sequence (past length + offset). Every layer gets the same kv_cache_params: with paged KV its past_key_value
        list is all None, and each layer finds its part of the pool by its local_layer_idx."""
        if given := sorted(name for name, value in unsupported.items() if value is not None):
            raise NotImplementedError(f"{ARCHITECTURE}: unsupported inputs {given} (LoRA, prompt tables, speculative decoding)")
        attention_params = Attention.fill_attention_params(self, attention_params)
        t = self.transformer
        step = dict(use_cache=use_cache, attention_mask=attention_mask, kv_cache_params=kv_cache_params,
                    attention_params=attention_params)
        trunk = t.run(t.layers, t.embed(input_ids, audio_input_ids), **step)   # [N, hidden]
        text = t.run(t.text_layers, trunk, **step)                             # [N, hidden]
        audio = t.run(t.audio_layers, trunk, **step)                           # [N, hidden]
        # each request's last token, [B, hidden]: before the final norms, which act row by row
        text = gather_last_token_logits(text, last_token_ids, True)
        audio = gather_last_token_logits(audio, last_token_ids, True)
        logits = self.lm_head(t.text_ln_f(text))                               # [B, vocab]
        audio_logits = self.audio_lm_head(t.audio_ln_f(audio))                 # [B, audio vocab]
        logits.mark_output("logits", self.config.logits_dtype)
        audio_logits.mark_output("audio_logits", self.config.logits_dtype)
        return logits, audio_logits
