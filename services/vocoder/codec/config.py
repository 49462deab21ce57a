"""The MOSS-Speech codec decoder's hyperparameters: the flow-matching token decoder and the HiFT generator.

MOSS-Speech's audio codes (the GLM-4-Voice tokenizer's: 16,384 codes at 12.5 Hz) are decoded by a
CosyVoice2-style `CausalMaskedDiffWithXvec` into an 80-band mel at 24 kHz with hop 480 (4 frames per token),
then by a HiFT generator (8 x 5 x 3 upsampling, then an iSTFT of hop 4: 480 samples per frame).

A codec directory holds `codec.json` (these dataclasses, nested as {"flow": {...}, "hift": {...}}) beside
`flow.pt` and `hift.pt`, the reference's state dicts (docs/codec.md). `moss_speech()` gives the published
architecture's dimensions (CosyVoice2's flow and 24 kHz HiFT, with MOSS-Speech's codebook, token rate and
4x upsampling); `tiny()` the same layout small enough for CPU tests.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from services.vocoder.token_decoder import MelFormat


@dataclass(frozen=True)
class EncoderConfig:
    """UpsampleConformerEncoder: tokens → conformer → ×upsample_stride → conformer (static-chunk attention)."""

    output_size: int = 512        # the reference fixes its lookahead and upsampling layers at 512 channels
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6           # conformer layers before the upsampling
    num_up_blocks: int = 4        # after it (the reference fixes 4)
    upsample_stride: int = 4      # mel frames per token
    static_chunk_size: int = 5    # tokens a streaming attention chunk holds (mel chunk: × upsample_stride)


@dataclass(frozen=True)
class EstimatorConfig:
    """CausalConditionalDecoder: the flow's velocity estimator, a 1-D U-Net of transformer blocks."""

    in_channels: int = 320        # x, mu, speaker, cond: 4 × 80 mel bands
    out_channels: int = 80
    channels: tuple[int, ...] = (256,)
    attention_head_dim: int = 64
    n_blocks: int = 4             # transformer blocks per U-Net level
    num_mid_blocks: int = 12
    num_heads: int = 8
    static_chunk_size: int = 20   # mel frames a streaming attention chunk holds


@dataclass(frozen=True)
class FlowConfig:
    vocab_size: int = 16384
    input_size: int = 512         # token embedding width
    output_size: int = 80         # mel bands
    spk_embed_dim: int = 192      # the speaker x-vector (CAM++)
    input_frame_rate: float = 12.5
    token_mel_ratio: int = 4
    pre_lookahead_len: int = 3    # tokens after a block the encoder reads before decoding it
    sampling_rate: int = 24000
    hop_size: int = 480
    n_timesteps: int = 10         # Euler steps
    inference_cfg_rate: float = 0.7
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)

    @property
    def mel_format(self) -> MelFormat:
        return MelFormat(self.sampling_rate, self.output_size, self.hop_size)


@dataclass(frozen=True)
class HiftConfig:
    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16
    istft_hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_cond_channels: int = 512

    @property
    def hop_size(self) -> int:
        prod = 1
        for rate in self.upsample_rates:
            prod *= rate
        return prod * self.istft_hop_len

    @property
    def mel_format(self) -> MelFormat:
        return MelFormat(self.sampling_rate, self.in_channels, self.hop_size)


@dataclass(frozen=True)
class CodecConfig:
    flow: FlowConfig = field(default_factory=FlowConfig)
    hift: HiftConfig = field(default_factory=HiftConfig)


def moss_speech() -> CodecConfig:
    return CodecConfig()


def tiny() -> CodecConfig:
    """The real layout, few and narrow layers (the encoder stays 512 wide: the reference fixes it)."""
    return CodecConfig(
        flow=FlowConfig(vocab_size=1024, input_size=512,
                        encoder=EncoderConfig(attention_heads=4, linear_units=128, num_blocks=1, num_up_blocks=1),
                        estimator=EstimatorConfig(channels=(32,), attention_head_dim=16, n_blocks=1, num_mid_blocks=1,
                                                  num_heads=2)),
        hift=HiftConfig(base_channels=32, f0_cond_channels=16, resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1,),),
                        source_resblock_kernel_sizes=(3, 3, 3), source_resblock_dilation_sizes=((1,), (1,), (1,)),
                        upsample_kernel_sizes=(16, 11, 7)),
    )


PRESETS = {"tiny": tiny, "moss-speech": moss_speech}


def _build(cls, data: dict, where: str):
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(known)}")
    values = {}
    for name, value in data.items():
        nested = {"encoder": EncoderConfig, "estimator": EstimatorConfig}.get(name)
        if nested is not None:
            value = _build(nested, value, f"{where}.{name}")
        elif isinstance(value, list):  # json arrays → the tuples the dataclasses hold
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        values[name] = value
    return cls(**values)


def read_config(path: str | Path) -> CodecConfig:
    """codec.json → CodecConfig; a field it leaves out takes moss_speech()'s value."""
    path = Path(path)
    data = json.loads(path.read_text())
    unknown = sorted(set(data) - {"flow", "hift"})
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {', '.join(unknown)}; known: flow, hift")
    return CodecConfig(flow=_build(FlowConfig, data.get("flow", {}), f"{path}: flow"),
                       hift=_build(HiftConfig, data.get("hift", {}), f"{path}: hift"))


def write_config(cfg: CodecConfig, path: str | Path) -> None:
    Path(path).write_text(json.dumps(asdict(cfg), indent=2) + "\n")
