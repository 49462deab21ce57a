"""MOSS-Speech as two Qwen3 models: the weight names of each path (tests/test_llm_reference.py checks both against
transformers' Qwen3ForCausalLM).

Each path through the model is a plain Qwen3 causal LM of `num_shared_layers + num_modality_layers` layers (36 at
the real size, config.json's `num_hidden_layers`):

    Qwen3ForCausalLM (the text path)           MossSpeechForCausalLM
    model.embed_tokens.weight                  model.embed_tokens.weight
    model.layers.{i}.<layer>  (i < S)          model.shared_block.layers.{i}.<layer>
    model.layers.{S + j}.<layer>               model.text_block.layers.{j}.<layer>
    model.norm.weight                          model.text_norm.weight
    lm_head.weight                             text_lm_head.weight

    Qwen3ForCausalLM (the audio path)          MossSpeechForCausalLM
    model.embed_tokens.weight                  model.audio_embed.weight
    model.layers.{i}.<layer>  (i < S)          model.shared_block.layers.{i}.<layer>
    model.layers.{S + j}.<layer>               model.audio_block.layers.{j}.<layer>
    model.norm.weight                          model.audio_norm.weight
    lm_head.weight                             audio_lm_head.weight

<layer> is the same in both: input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
post_attention_layernorm, mlp.{gate,up,down}_proj (each `.weight`). What a single Qwen3 cannot say: a position's
input is the text embedding of its text token, except where the text channel holds `modality_pad`, where it is the
audio embedding of its audio token (MossSpeechModel.embed); so the audio path's `embed_tokens` is only right for
positions in audio mode, and a Qwen3 run of either path takes `inputs_embeds` built that way.
"""

from __future__ import annotations

from services.llm.model.config import MossSpeechConfig

LAYER_WEIGHTS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj")
PATHS = {"text": ("model.embed_tokens", "text_block", "model.text_norm", "text_lm_head"),
         "audio": ("model.audio_embed", "audio_block", "model.audio_norm", "audio_lm_head")}


def qwen3_names(cfg: MossSpeechConfig, path: str) -> dict[str, str]:
    """{Qwen3ForCausalLM weight name: MossSpeechForCausalLM weight name} for one path ("text" or "audio")."""
    embed, block, norm, head = PATHS[path]
    names = {"model.embed_tokens.weight": f"{embed}.weight", "model.norm.weight": f"{norm}.weight",
             "lm_head.weight": f"{head}.weight"}
    layers = [f"model.shared_block.layers.{i}" for i in range(cfg.num_shared_layers)]
    layers += [f"model.{block}.layers.{j}" for j in range(cfg.num_modality_layers)]
    for i, ours in enumerate(layers):
        for weight in LAYER_WEIGHTS:
            names[f"model.layers.{i}.{weight}.weight"] = f"{ours}.{weight}.weight"
    return names
