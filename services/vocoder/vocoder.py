"""Token decoder + BigVGAN: audio tokens → mel → waveform, for one model instance."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from services.vocoder import generator as gen
from services.vocoder.receptive_field import receptive_field
from services.vocoder.runner import GeneratorRunner
from services.vocoder.token_decoder import (
    DecoderState,
    TokenDecoder,
    TokenDecoderConfig,
    load_token_decoder,
    random_token_decoder,
)

log = logging.getLogger(__name__)

TINY_CODEBOOK = 1024  # services/llm/config.py tiny_config().audio_codebook_size


class MelFormatMismatch(ValueError):
    pass


@dataclass
class TokenVocoder:
    decoder: TokenDecoder
    generator: torch.nn.Module
    device: torch.device

    def __post_init__(self):
        produced = self.decoder.cfg.mel_format
        consumed = gen.mel_format(self.generator.h)
        if produced != consumed:
            raise MelFormatMismatch(
                f"the token decoder produces mel frames of {produced} but the BigVGAN vocoder expects {consumed}; "
                "use a vocoder trained for the token decoder's mel format"
            )
        self.decoder.to(self.device)
        self.runner = GeneratorRunner(self.generator, self.hop_size, self.device)

    @property
    def sample_rate(self) -> int:
        return self.decoder.cfg.sampling_rate

    @property
    def hop_size(self) -> int:
        return self.decoder.cfg.hop_size

    @property
    def codebook_size(self) -> int:
        return self.decoder.cfg.codebook_size

    @property
    def receptive_field(self) -> tuple[int, int]:
        """Mel frames (before, after) that a frame's samples depend on."""
        return receptive_field(self.generator.h)

    @property
    def samples_per_token(self) -> int:
        return self.decoder.cfg.samples_per_token

    def mel(self, tokens: list[int]) -> torch.Tensor:
        """A whole stream's tokens → log-mel [num_mels, len(tokens) * frames_per_token]."""
        return self.decoder(torch.tensor(tokens, dtype=torch.long, device=self.device))

    def mel_chunk(self, tokens: list[int], state: DecoderState | None) -> tuple[torch.Tensor, DecoderState]:
        """A chunk of one stream's tokens and the stream's decoder state (None at its start) → (log-mel
        [num_mels, len(tokens) * frames_per_token], the stream's next state)."""
        return self.decoder.decode(torch.tensor(tokens, dtype=torch.long, device=self.device), state)

    def mel_chunks(self, chunks: list[tuple[list[int], DecoderState | None]]) -> list[tuple[torch.Tensor, DecoderState]]:
        """mel_chunk for several streams at once (one pass of the token decoder)."""
        tokens = torch.tensor([t for chunk, _ in chunks for t in chunk], dtype=torch.long, device=self.device)
        return self.decoder.decode_batch(tokens, [len(chunk) for chunk, _ in chunks], [state for _, state in chunks])

    def vocode(self, windows: list[torch.Tensor], last: list[bool]) -> list[np.ndarray]:
        """Windows of mel [num_mels, F_i] (any streams) → float32 samples [F_i * hop] each, in [-1, 1];
        last[i]: window i ends its stream. Batched and padded as runner.py describes. (A config whose
        upsample kernels exceed their strides by an odd number, as the 24 kHz hop-480 preset's do,
        yields a few samples after the last frame's: they are cut.)"""
        return [wav.numpy() for wav in self.runner(windows, last)]

    def waveform(self, mel: torch.Tensor) -> np.ndarray:
        """Offline synthesis: mel [num_mels, frames] → float32 samples [frames * hop]."""
        return self.vocode([mel], [True])[0]


def load_vocoder(directory: str | Path | None, preset: str = "tiny", device: str = "cpu", seed: int = 0) -> TokenVocoder:
    """From a directory (BigVGAN config + checkpoint, token decoder beside it), or a preset with
    random weights. A directory without a token decoder gets a random one in its mel format."""
    dev = torch.device(device)
    if directory is None:
        h = gen.preset_config(preset)
        tiny = preset == "tiny"
        decoder = _random_decoder_for(h, TINY_CODEBOOK if tiny else 16384, 64 if tiny else 512, seed)
        log.warning("no --vocoder-dir: %r vocoder preset with RANDOM weights (output is noise)", preset)
        return TokenVocoder(decoder, gen.build_generator(h, seed=seed), dev)
    generator, h = gen.load_generator(directory)
    if (Path(directory) / "token_decoder.json").exists():
        decoder = load_token_decoder(directory)
    else:
        decoder = _random_decoder_for(h, 16384, 512, seed)
        log.warning("%s has no token_decoder.json: using a RANDOM token decoder for %s", directory, gen.mel_format(h))
    return TokenVocoder(decoder, generator, dev)


def _random_decoder_for(h, codebook_size: int, embed_dim: int, seed: int) -> TokenDecoder:
    """A random token decoder producing the mel format the BigVGAN config `h` consumes."""
    mel = gen.mel_format(h)
    cfg = TokenDecoderConfig(codebook_size=codebook_size, num_mels=mel.num_mels, sampling_rate=mel.sampling_rate,
                             hop_size=mel.hop_size, embed_dim=embed_dim)
    return random_token_decoder(cfg, seed=seed)
