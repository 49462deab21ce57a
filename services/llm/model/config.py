"""MOSS-Speech model configuration and model spec: dimensions plus every special token id.

One object answers every "which id is ..." question (docs/architecture.md §2), read from the checkpoint's
config.json where present. Presets: `moss-speech` (the published dimensions) and `tiny` (a few layers
and small vocabularies that keep the special-token layout, for tests and the demo).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

# Qwen-family special tokens sit at the top of the text vocabulary. Offsets from <|endoftext|>:
ENDOFTEXT_OFFSET, IM_START_OFFSET, IM_END_OFFSET, SOSP_OFFSET, MODALITY_PAD_OFFSET = 0, 1, 2, 3, 24
NUM_SPECIAL_TEXT_TOKENS = 37  # 151643 .. 151679


@dataclass(frozen=True)
class MossSpeechConfig:
    # Transformer trunk and branches (Qwen3 blocks).
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    num_shared_layers: int = 32
    num_modality_layers: int = 4      # layers in each branch (text and audio)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    # Vocabularies.
    vocab_size: int = 151680        # text
    audio_vocab_size: int = 16512   # audio head rows
    audio_codebook_size: int = 16384  # codes 0..16383 are audio; eosp follows
    # Special token ids (text channel).
    endoftext_token_id: int = 151643
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    sosp_token_id: int = 151646      # <|object_ref_start|>: start of speech
    modality_pad_token_id: int = 151667
    # Special token ids (audio channel).
    eosp_token_id: int = 16384       # end of speech
    audio_pad_token_id: int = 512    # not in the published config.json (?): upstream hard-codes 512
    torch_dtype: str = "bfloat16"
    extra: dict = field(default_factory=dict, compare=False)  # unknown config.json keys, kept verbatim

    # ---- derived -----------------------------------------------------------------------------
    @property
    def num_hidden_layers(self) -> int:
        """config.json's count along one path: shared + one branch (36 for MOSS-Speech)."""
        return self.num_shared_layers + self.num_modality_layers

    @property
    def num_layers(self) -> int:
        """All layer instances holding K/V: shared, then text branch, then audio branch (40)."""
        return self.num_shared_layers + 2 * self.num_modality_layers

    @property
    def audio_logits_limit(self) -> int:
        """Audio logits at or above this index are masked to -inf (valid: codes, eosp, eosp+1)."""
        return self.eosp_token_id + 2

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (self.endoftext_token_id, self.im_end_token_id)

    @property
    def num_parameters(self) -> int:
        """The weights' count, from the shapes model.py builds (9.1 B for MOSS-Speech): what a device must hold,
        known without building the model (on the meta device its embeddings' init alone imports torch._dynamo)."""
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + 2 * self.head_dim  # q, k, v, o; q and k norms
        layer = attention + 3 * h * self.intermediate_size + 2 * h    # gate, up, down; two norms
        vocab = self.vocab_size + self.audio_vocab_size
        return self.num_layers * layer + 2 * vocab * h + 2 * h        # embeddings and heads; the branches' final norms

    @property
    def kv_bytes_per_token(self) -> int:
        itemsize = 2 if self.torch_dtype in ("bfloat16", "float16") else 4
        return self.num_layers * 2 * self.num_key_value_heads * self.head_dim * itemsize

    # ---- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        d.update({
            "model_type": "moss_speech",
            "architectures": ["MossSpeechForCausalLM"],
            "num_hidden_layers": self.num_hidden_layers,
            "tie_word_embeddings": False,
        })
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "MossSpeechConfig":
        d = _rope_theta_read(d)
        refuse_unsupported(d)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        derived = ("model_type", "architectures", "num_hidden_layers", "tie_word_embeddings")
        extra = {k: v for k, v in d.items() if k not in names and k not in derived}
        cfg = cls(**known, extra=extra)
        if "num_hidden_layers" in d and d["num_hidden_layers"] != cfg.num_hidden_layers:
            raise ValueError(
                f"config.json: num_hidden_layers={d['num_hidden_layers']} but num_shared_layers + "
                f"num_modality_layers = {cfg.num_hidden_layers}"
            )
        if d.get("tie_word_embeddings"):
            raise ValueError("config.json: tied embeddings are not supported (MOSS-Speech unties them)")
        return cfg

    @classmethod
    def from_json(cls, path: str | Path) -> "MossSpeechConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def _rope_theta_read(d: dict) -> dict:
    """config.json's RoPE base: `rope_theta`, or transformers 5's `rope_parameters` ({"rope_type", "rope_theta"})."""
    params = d.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        if "rope_theta" in d and d["rope_theta"] != params["rope_theta"]:
            raise ValueError(f"config.json: rope_theta {d['rope_theta']} and rope_parameters.rope_theta "
                             f"{params['rope_theta']} disagree")
        d = {**d, "rope_theta": params["rope_theta"]}
    return d


def refuse_unsupported(d: dict) -> None:
    """ValueError naming a config.json setting this model does not implement, where it is set to anything but what
    a plain Qwen3 has (kept silently, it would change every logit): RoPE scaling (linear, dynamic, YaRN, ...), an
    activation other than SiLU, attention biases, sliding-window attention."""
    scaling = d.get("rope_scaling") or {}
    params = d.get("rope_parameters") or {}
    for name, rope in (("rope_scaling", scaling), ("rope_parameters", params)):
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else rope
        if kind not in ("default", None):
            raise ValueError(f"config.json: {name} {rope!r} is not supported (only plain RoPE: rope_type default)")
    checks = {"hidden_act": ("silu", d.get("hidden_act", "silu")), "attention_bias": (False, d.get("attention_bias", False)),
              "use_sliding_window": (False, d.get("use_sliding_window", False)),
              "mlp_bias": (False, d.get("mlp_bias", False))}
    for name, (supported, value) in checks.items():
        if value != supported:
            raise ValueError(f"config.json: {name} {value!r} is not supported (only {supported!r}, as Qwen3's)")
    if any(kind != "full_attention" for kind in d.get("layer_types") or []):
        raise ValueError(f"config.json: layer_types {sorted(set(d['layer_types']))} is not supported (only "
                         "full_attention)")


def tiny_config() -> MossSpeechConfig:
    """A few layers, small vocabularies, the same special-token layout.

    Text: 256 byte tokens, then the 37 specials at the real offsets (endoftext 256, im_start 257,
    im_end 258, sosp 259, modality_pad 280). Audio: 1024 codes, eosp 1024, audio_pad 512 (a code,
    as in the real model), 128 rows above the codebook as in the real head.
    """
    base = 256
    codebook = 1024
    return MossSpeechConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_shared_layers=2,
        num_modality_layers=1,
        max_position_embeddings=4096,
        vocab_size=base + NUM_SPECIAL_TEXT_TOKENS,
        audio_vocab_size=codebook + 128,
        audio_codebook_size=codebook,
        endoftext_token_id=base + ENDOFTEXT_OFFSET,
        im_start_token_id=base + IM_START_OFFSET,
        im_end_token_id=base + IM_END_OFFSET,
        sosp_token_id=base + SOSP_OFFSET,
        modality_pad_token_id=base + MODALITY_PAD_OFFSET,
        eosp_token_id=codebook,
        audio_pad_token_id=512,
        torch_dtype="float32",
    )


PRESETS = {"moss-speech": MossSpeechConfig, "tiny": tiny_config}


def preset(name: str) -> MossSpeechConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None
