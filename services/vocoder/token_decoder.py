"""Audio tokens → mel frames: `frames_per_token` frames of `num_mels` bands per token.

MOSS-Speech's codec decodes tokens with a flow-matching model into an 80-band mel at 24 kHz, hop 480
(4 frames per 80 ms token). This decoder has that interface: an embedding per code projected to the
token's frames. Each token's frames depend on that token alone, so streamed and offline decoding agree
exactly and all context handling lives in the vocoder stage. Saved as token_decoder.json +
token_decoder.safetensors beside the BigVGAN checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn


@dataclass(frozen=True)
class MelFormat:
    sampling_rate: int
    num_mels: int
    hop_size: int

    def __str__(self) -> str:
        return f"{self.sampling_rate} Hz, {self.num_mels} bands, hop {self.hop_size}"


@dataclass(frozen=True)
class TokenDecoderConfig:
    codebook_size: int = 16384
    frames_per_token: int = 4
    num_mels: int = 80
    sampling_rate: int = 24000
    hop_size: int = 480
    embed_dim: int = 512

    @property
    def mel_format(self) -> MelFormat:
        return MelFormat(self.sampling_rate, self.num_mels, self.hop_size)

    @property
    def samples_per_token(self) -> int:
        return self.frames_per_token * self.hop_size


class TokenDecoder(nn.Module):
    def __init__(self, cfg: TokenDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.codebook_size, cfg.embed_dim)
        self.proj = nn.Linear(cfg.embed_dim, cfg.frames_per_token * cfg.num_mels)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [n] → log-mel [num_mels, n * frames_per_token]."""
        frames = self.proj(self.embed(tokens))  # [n, frames_per_token * num_mels]
        return frames.view(-1, self.cfg.num_mels).T.contiguous()


def save_token_decoder(decoder: TokenDecoder, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token_decoder.json").write_text(json.dumps(asdict(decoder.cfg), indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in decoder.state_dict().items()}, str(directory / "token_decoder.safetensors"))


def load_token_decoder(directory: str | Path) -> TokenDecoder:
    directory = Path(directory)
    cfg = TokenDecoderConfig(**json.loads((directory / "token_decoder.json").read_text()))
    decoder = TokenDecoder(cfg)
    decoder.load_state_dict(load_file(str(directory / "token_decoder.safetensors")))
    return decoder.eval()


def random_token_decoder(cfg: TokenDecoderConfig, seed: int = 0) -> TokenDecoder:
    torch.manual_seed(seed)
    decoder = TokenDecoder(cfg)
    with torch.no_grad():  # log-mel-like range: around -5 with unit spread
        decoder.proj.weight.mul_(0.5)
        decoder.proj.bias.fill_(-5.0)
    return decoder.eval()
