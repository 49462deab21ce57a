"""HF MOSS-Speech weights → a TensorRT-LLM checkpoint (config.json and rank0.safetensors, TP = PP = 1), the input of
`trtllm-build` for the dual-head engine (docs/tensorrt.md).

Names follow TensorRT-LLM's Qwen3 checkpoints (its models/qwen/convert.py), the shared trunk as the usual
`transformer.layers`, each branch as layers of its own, and a second embedding, final norm and head:

| HF (official) | TensorRT-LLM |
| --- | --- |
| model.embed_tokens | transformer.vocab_embedding |
| model.audio_embed | transformer.audio_embedding |
| model.shared_block.layers.N / text_block / audio_block | transformer.layers.N / text_layers.N / audio_layers.N |
| ….input_layernorm / post_attention_layernorm | ….input_layernorm / post_layernorm |
| ….self_attn.q_proj, k_proj, v_proj | ….attention.qkv (q, k, v stacked by rows) |
| ….self_attn.o_proj | ….attention.dense |
| ….self_attn.q_norm / k_norm | ….attention.q_layernorm / k_layernorm |
| ….mlp.gate_proj / up_proj / down_proj | ….mlp.fc / mlp.gate / mlp.proj (TensorRT-LLM's GatedMLP: proj(silu(fc x) · gate x)) |
| model.text_norm / model.audio_norm | transformer.text_ln_f / transformer.audio_ln_f |
| text_lm_head / audio_lm_head | lm_head / audio_lm_head |

Every official tensor is mapped, and only those: the HF side is loaded strictly by key and shape
(checkpoint.load_pretrained), and the result is checked against the names the config implies, both ways.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from services.llm.model.checkpoint import CheckpointError, load_pretrained
from services.llm.model.config import MossSpeechConfig
from services.llm.model.model import MossSpeechForCausalLM

ARCHITECTURE = "MossSpeechForCausalLM"
WEIGHTS = "rank0.safetensors"
BRANCHES = (("shared_block", "layers"), ("text_block", "text_layers"), ("audio_block", "audio_layers"))
GLOBALS = {"model.embed_tokens.weight": "transformer.vocab_embedding.weight",
           "model.audio_embed.weight": "transformer.audio_embedding.weight",
           "model.text_norm.weight": "transformer.text_ln_f.weight",
           "model.audio_norm.weight": "transformer.audio_ln_f.weight",
           "text_lm_head.weight": "lm_head.weight",
           "audio_lm_head.weight": "audio_lm_head.weight"}
LAYER_RENAMES = {"input_layernorm.weight": "input_layernorm.weight",
                 "post_attention_layernorm.weight": "post_layernorm.weight",
                 "self_attn.o_proj.weight": "attention.dense.weight",
                 "self_attn.q_norm.weight": "attention.q_layernorm.weight",
                 "self_attn.k_norm.weight": "attention.k_layernorm.weight",
                 "mlp.gate_proj.weight": "mlp.fc.weight",
                 "mlp.up_proj.weight": "mlp.gate.weight",
                 "mlp.down_proj.weight": "mlp.proj.weight"}
QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")


def layer_prefixes(cfg: MossSpeechConfig) -> list[tuple[str, str]]:
    """(HF prefix, TensorRT-LLM prefix) of every layer, shared, text and audio."""
    counts = {"shared_block": cfg.num_shared_layers, "text_block": cfg.num_modality_layers,
              "audio_block": cfg.num_modality_layers}
    return [(f"model.{block}.layers.{i}.", f"transformer.{ours}.{i}.")
            for block, ours in BRANCHES for i in range(counts[block])]


def to_trtllm(state: dict[str, torch.Tensor], cfg: MossSpeechConfig) -> dict[str, torch.Tensor]:
    """An HF state dict (official keys) → TensorRT-LLM's tensors; CheckpointError on any key not accounted for."""
    out, used = {}, set()
    for hf, ours in GLOBALS.items():
        out[ours] = state[hf]
        used.add(hf)
    for hf_prefix, prefix in layer_prefixes(cfg):
        for hf, ours in LAYER_RENAMES.items():
            out[prefix + ours] = state[hf_prefix + hf]
            used.add(hf_prefix + hf)
        out[prefix + "attention.qkv.weight"] = torch.cat([state[hf_prefix + name] for name in QKV])
        used.update(hf_prefix + name for name in QKV)
    if left := sorted(set(state) - used):
        raise CheckpointError(f"tensors with no TensorRT-LLM name: {left[:5]}{' …' if len(left) > 5 else ''}")
    return {k: v.contiguous() for k, v in out.items()}


def to_hf(tensors: dict[str, torch.Tensor], cfg: MossSpeechConfig) -> dict[str, torch.Tensor]:
    """TensorRT-LLM's tensors → the HF state dict (the converse of to_trtllm; tests, and the fake engine's weights)."""
    expected = set(trtllm_names(cfg))
    if missing := sorted(expected - set(tensors)):
        raise CheckpointError(f"missing {missing[:5]}{' …' if len(missing) > 5 else ''}")
    if unexpected := sorted(set(tensors) - expected):
        raise CheckpointError(f"unexpected {unexpected[:5]}{' …' if len(unexpected) > 5 else ''}")
    state = {hf: tensors[ours] for hf, ours in GLOBALS.items()}
    q_rows = cfg.num_attention_heads * cfg.head_dim
    kv_rows = cfg.num_key_value_heads * cfg.head_dim
    for hf_prefix, prefix in layer_prefixes(cfg):
        for hf, ours in LAYER_RENAMES.items():
            state[hf_prefix + hf] = tensors[prefix + ours]
        for name, part in zip(QKV, tensors[prefix + "attention.qkv.weight"].split([q_rows, kv_rows, kv_rows])):
            state[hf_prefix + name] = part
    return state


def trtllm_names(cfg: MossSpeechConfig) -> list[str]:
    layer = [*LAYER_RENAMES.values(), "attention.qkv.weight"]
    return [*GLOBALS.values(), *(prefix + name for _, prefix in layer_prefixes(cfg) for name in layer)]


def kv_layer_plan(shared: int, text: int, audio: int) -> dict[str, range]:
    """Each TensorRT-LLM layer stack (transformer.<name>.N) → the KV-pool layer indices of its layers: model.py's
    Block(first_layer=...) order, which the runners' pool [blocks, layers, 2, kv heads, block, head dim] follows and the
    engine's attention layers must too (trtllm_model.py: each layer's local_layer_idx)."""
    return {"layers": range(0, shared), "text_layers": range(shared, shared + text),
            "audio_layers": range(shared + text, shared + text + audio)}


def trtllm_config(cfg: MossSpeechConfig, dtype: str) -> dict:
    """config.json of the TensorRT-LLM checkpoint: TensorRT-LLM's PretrainedConfig fields, and the model's own."""
    return {
        "architecture": ARCHITECTURE,
        "dtype": dtype,
        "vocab_size": cfg.vocab_size,
        "audio_vocab_size": cfg.audio_vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_shared_layers,
        "num_text_layers": cfg.num_modality_layers,
        "num_audio_layers": cfg.num_modality_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_size": cfg.head_dim,
        "hidden_act": "silu",
        "norm_epsilon": cfg.rms_norm_eps,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "qk_layernorm": True,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "moss_speech": cfg.to_dict(),  # every token id, as the HF config.json has them
    }


def convert(hf_dir: str | Path, out_dir: str | Path, dtype: str | None = None) -> Path:
    """Write the TensorRT-LLM checkpoint of the HF checkpoint in hf_dir → out_dir. dtype: the weights' (default: the
    checkpoint's). Raises CheckpointError for a directory that is not a complete MOSS-Speech checkpoint."""
    model = load_pretrained(hf_dir, dtype=_torch_dtype(dtype) if dtype else None)
    cfg = model.cfg
    tensors = to_trtllm(model.state_dict(), cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS), metadata={"format": "pt"})
    name = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(trtllm_config(cfg, name), indent=2) + "\n")
    return out


def read_config(directory: str | Path) -> tuple[dict, MossSpeechConfig]:
    """A TensorRT-LLM checkpoint's (or engine's pretrained_config's) config → (it, the model's config)."""
    path = Path(directory) / "config.json"
    if not path.exists():
        raise CheckpointError(f"{directory}: config.json not found")
    config = json.loads(path.read_text())
    config = config.get("pretrained_config", config)  # an engine directory nests it
    if config.get("architecture") != ARCHITECTURE:
        raise CheckpointError(f"{directory}: architecture {config.get('architecture')!r}, not {ARCHITECTURE!r}")
    if "moss_speech" not in config:
        raise CheckpointError(f"{directory}: config.json has no moss_speech section (the model's token ids)")
    return config, MossSpeechConfig.from_dict(config["moss_speech"])


def load_model(directory: str | Path, device: str | torch.device = "cpu") -> MossSpeechForCausalLM:
    """A TensorRT-LLM checkpoint's weights as the model (the converse of convert: tests and the fake engine)."""
    _, cfg = read_config(directory)
    with safe_open(str(Path(directory) / WEIGHTS), framework="pt", device=str(device)) as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    state = to_hf(tensors, cfg)
    with torch.device("meta"):
        model = MossSpeechForCausalLM(cfg)
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval()


def _torch_dtype(name: str) -> torch.dtype:
    if name not in ("float32", "bfloat16", "float16"):
        raise CheckpointError(f"dtype {name!r}: float32, bfloat16 or float16")
    return getattr(torch, name)


def main(argv: list[str] | None = None) -> int:
    """python -m services.llm.model.trtllm_checkpoint HF_DIR OUT_DIR [--dtype D]: the conversion, for trtllm-build."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m services.llm.model.trtllm_checkpoint", description=main.__doc__)
    p.add_argument("hf_dir", help="the HF MOSS-Speech checkpoint (config.json, safetensors)")
    p.add_argument("out_dir", help="where the TensorRT-LLM checkpoint goes (config.json, rank0.safetensors)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: the checkpoint's")
    args = p.parse_args(argv)
    try:
        out = convert(args.hf_dir, args.out_dir, args.dtype)
    except CheckpointError as exc:
        print(f"cannot convert: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out / 'config.json'} and {out / WEIGHTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
