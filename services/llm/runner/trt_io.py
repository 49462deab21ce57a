"""The IO of a TensorRT-LLM engine of the dual-head model, as the TRT runner (trt_runner.py) binds it: which tensors,
which dtypes and ranks, for which TensorRT-LLM release (shared/DESIGN.md §3). Read from the engine's own IO list,
never assumed: an engine whose list this module does not understand is refused, its tensors named.

The engine is GPT-style, built with the GPT attention plugin, paged KV and packed input (remove_input_padding), one
pool for the 40 attention layers (32 shared + 4 text + 4 audio), TP = PP = 1. Its inputs, int32 unless noted
(N: the step's packed tokens; B: its requests; L: attention layers; M: blocks per request, at most):

| input | shape | set to |
| --- | --- | --- |
| input_ids | [N] | the text channel's ids |
| audio_input_ids | [N] | the audio channel's ids (ours: the model embeds a position by one channel or the other) |
| position_ids | [N] | each token's position |
| last_token_ids | [B] | the cumulative token counts (packed input) |
| kv_cache_block_offsets, host_kv_cache_block_offsets | [1, B, 2, M] (0.13: [B, 2, M]) | block · 2L + field (0 K, 1 V) |
| host_kv_cache_pool_pointers | int64 [1, 2] (0.13: [2]) | [the pool's address, 0] |
| host_kv_cache_pool_mapping | [L] (0.14+) | 0: every layer in the one pool |
| sequence_length | [B] | positions after this step |
| context_lengths, host_context_lengths | [B] | a context request's tokens in this step; a generation request's prompt |
| host_past_key_value_lengths | [B] | a context request's positions after this step; a generation request's before |
| host_request_types | [B] | 0 context (prefill, whole or a chunk), 1 generation (one new token) |
| host_max_attention_window_sizes | [L] | the engine's max_seq_len |
| host_sink_token_length | [1] | 0 |
| cache_indirection | [B, 1, W] | zeros (beam width 1) |
| host_runtime_perf_knobs | int64 [16] (0.13+) | -1: the engine's defaults |
| host_context_progress | int64 [1] (0.15+) | 0: no layer-wise progress |

Outputs: logits [B, text vocab] and audio_logits [B, audio vocab], each request's last token, in the engine's dtype
(float32 when built with `--logits_dtype float32`). TensorRT-LLM's own GenerationSession and ModelRunner refuse an
engine with an output besides `logits`; this runner reads both.
"""

from __future__ import annotations

from dataclasses import dataclass

# name → (dtype, rank); the variants' differences are in VARIANTS
COMMON_INPUTS = {
    "input_ids": ("int32", 1),
    "audio_input_ids": ("int32", 1),
    "position_ids": ("int32", 1),
    "last_token_ids": ("int32", 1),
    "sequence_length": ("int32", 1),
    "context_lengths": ("int32", 1),
    "host_context_lengths": ("int32", 1),
    "host_past_key_value_lengths": ("int32", 1),
    "host_request_types": ("int32", 1),
    "host_max_attention_window_sizes": ("int32", 1),
    "host_sink_token_length": ("int32", 1),
    "cache_indirection": ("int32", 3),
    "host_runtime_perf_knobs": ("int64", 1),
}
OUTPUTS = {"logits": 2, "audio_logits": 2}
LOGITS_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Variant:
    """How one generation of TensorRT-LLM releases lays out the paged-KV inputs."""

    name: str
    pools_axis: bool       # block offsets [pools, B, 2, M] and pool pointers [pools, 2] (else [B, 2, M] and [2])
    pool_mapping: bool     # host_kv_cache_pool_mapping [L]
    context_progress: bool  # host_context_progress int64 [1]

    def inputs(self) -> dict[str, tuple[str, int]]:
        rank = 4 if self.pools_axis else 3
        own = {"kv_cache_block_offsets": ("int32", rank), "host_kv_cache_block_offsets": ("int32", rank),
               "host_kv_cache_pool_pointers": ("int64", 2 if self.pools_axis else 1)}
        if self.pool_mapping:
            own["host_kv_cache_pool_mapping"] = ("int32", 1)
        if self.context_progress:
            own["host_context_progress"] = ("int64", 1)
        return {**COMMON_INPUTS, **own}


VARIANTS = (
    Variant("0.13", pools_axis=False, pool_mapping=False, context_progress=False),
    Variant("0.14", pools_axis=True, pool_mapping=True, context_progress=False),
    Variant("0.15+", pools_axis=True, pool_mapping=True, context_progress=True),
)


class EngineRefused(ValueError):
    """An engine directory or engine this runner cannot drive: the llm does not start (one line, services/cli.py)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    is_input: bool
    dtype: str          # "int32", "int64", "float32", "float16", "bfloat16", ...
    shape: tuple[int, ...]  # -1 where the engine's profile lets it vary
    on_host: bool       # as the engine lists it (TensorRT-LLM declares none so: its runtime places host_* by name)


@dataclass(frozen=True)
class EngineIO:
    variant: Variant
    tensors: dict[str, TensorSpec]

    @property
    def inputs(self) -> list[str]:
        return [t.name for t in self.tensors.values() if t.is_input]

    def logits_dtype(self, name: str) -> str:
        return self.tensors[name].dtype


def understand(tensors: list[TensorSpec]) -> EngineIO:
    """An engine's IO list → its variant, or EngineRefused naming what does not fit: a missing or unknown input,
    an output besides logits and audio_logits, a wrong dtype or rank."""
    by_name = {t.name: t for t in tensors}
    outputs = {t.name for t in tensors if not t.is_input}
    if outputs != set(OUTPUTS):
        raise EngineRefused(f"its outputs are {sorted(outputs)}; a dual-head engine has exactly {sorted(OUTPUTS)}")
    given = {t.name for t in tensors if t.is_input}
    candidates = [v for v in VARIANTS if set(v.inputs()) == given]
    if not candidates:  # name the closest variant's differences
        closest = min(VARIANTS, key=lambda v: len(set(v.inputs()) ^ given))
        missing, unknown = sorted(set(closest.inputs()) - given), sorted(given - set(closest.inputs()))
        raise EngineRefused("its inputs match no TensorRT-LLM release this runner knows "
                            f"({', '.join(v.name for v in VARIANTS)}); against {closest.name}: "
                            f"missing {missing or 'none'}, unknown {unknown or 'none'}")
    variant = candidates[0]
    for name, (dtype, rank) in variant.inputs().items():
        t = by_name[name]
        if t.dtype != dtype or len(t.shape) != rank:
            raise EngineRefused(f"input {name} is {t.dtype} of rank {len(t.shape)}; TensorRT-LLM "
                                f"{variant.name} has {dtype} of rank {rank}")
    for name, rank in OUTPUTS.items():
        t = by_name[name]
        if t.dtype not in LOGITS_DTYPES or len(t.shape) != rank:
            raise EngineRefused(f"output {name} is {t.dtype} of rank {len(t.shape)}; expected "
                                f"{' or '.join(LOGITS_DTYPES)} of rank {rank}")
    return EngineIO(variant, by_name)
