"""The Whisper-VQ speech tokenizer's hyperparameters, named as in the official `config.json` (THUDM's
glm-4-voice-tokenizer, which MOSS-Speech's codes come from), so that file reads straight into them.

Only what the encoder runs is kept: 128 mel bins at 100 frames a second, two causal convolutions (the second
of stride 2: 50 frames a second), `quantize_position` causal transformer layers, then an average pool of
`pooling_kernel_size` frames (12.5 a second) and the nearest of `quantize_vocab_size` codebook vectors. The
official file's decoder and the encoder layers past the quantizer are not needed to make codes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

SAMPLE_RATE = 16_000   # Hz: the feature extractor's input
HOP = 160              # samples a mel frame (100 a second)


class UnsupportedConfig(ValueError):
    pass


@dataclass(frozen=True)
class WhisperVQConfig:
    num_mel_bins: int = 128
    d_model: int = 1280
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    quantize_position: int = 16       # layers before the codes are read (the encoder runs only these)
    pooling_kernel_size: int = 4      # frames averaged into one code
    quantize_vocab_size: int = 16384
    max_source_positions: int = 1500  # positions after the stride-2 convolution: 30 s a segment

    @property
    def mel_frames_per_code(self) -> int:
        return 2 * self.pooling_kernel_size  # conv2's stride, then the pool

    @property
    def segment_mel_frames(self) -> int:
        """Mel frames a segment holds: the reference encodes audio in independent 30 s segments."""
        return 2 * self.max_source_positions

    @property
    def segment_samples(self) -> int:
        return self.segment_mel_frames * HOP


def glm4_voice() -> WhisperVQConfig:
    """The published tokenizer's dimensions (Whisper-large-v3's encoder, causal, quantized after layer 16)."""
    return WhisperVQConfig()


def tiny() -> WhisperVQConfig:
    """The same layout, small enough for CPU tests (heads of 16: the attention kernel's smallest)."""
    return WhisperVQConfig(num_mel_bins=16, d_model=64, encoder_attention_heads=4, encoder_ffn_dim=128,
                           quantize_position=2, quantize_vocab_size=64, max_source_positions=40)


# What the official config must say for this encoder to be the one it describes (field: required value).
REQUIRED = {"encoder_causal_attention": True, "encoder_causal_convolution": True, "pooling_type": "avg",
            "activation_function": "gelu", "scale_embedding": False}


def read_config(path: str | Path) -> WhisperVQConfig:
    """The official `config.json` → WhisperVQConfig; a config this encoder cannot run is refused, naming why."""
    data = json.loads(Path(path).read_text())
    wrong = [f"{k}={data.get(k)!r} (needs {v!r})" for k, v in REQUIRED.items() if k in data and data[k] != v]
    if data.get("pooling_position", data.get("quantize_position")) != data.get("quantize_position", 16):
        wrong.append(f"pooling_position={data.get('pooling_position')} (needs quantize_position, "
                     f"{data.get('quantize_position')})")
    if wrong:
        raise UnsupportedConfig(f"{path}: " + ", ".join(wrong))
    return WhisperVQConfig(**{f.name: data[f.name] for f in fields(WhisperVQConfig) if f.name in data})
