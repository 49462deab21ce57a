"""A vocoder built from what the user gives: a codec directory (the flow and HiFT, or the flow and a BigVGAN-v2 of
its mel format), a directory of BigVGAN files only (the stand-in), or a preset with random weights; and the codec read
ahead on the CPU by a spare (read_ahead.py), which the next load with the same arguments takes."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from services.common.read_ahead import ReadAhead
from services.vocoder import generator as gen
from services.vocoder.codec import checkpoint as codec_checkpoint
from services.vocoder.codec import config as codec_config
from services.vocoder.codec.decoder import DEFAULT_BLOCK_TOKENS, DEFAULT_MAX_CONTEXT_TOKENS, FlowTokenDecoder
from services.vocoder.codec.history import DEFAULT_RING_FRAMES
from services.vocoder.codec.voice import DEFAULT, Voice, load_voices, random_voice
from services.vocoder.token_decoder import TokenDecoder, TokenDecoderConfig, load_token_decoder, random_token_decoder
from services.vocoder.vocoder import TokenVocoder

log = logging.getLogger(__name__)

TINY_CODEBOOK = 1024  # services/llm/config.py tiny_config().audio_codebook_size
PRESETS = ("tiny", "tiny-codec", "moss-speech")
DEFAULT_PROMPT_TOKENS = 40  # a random voice's prompt: 3.2 s, whole blocks (docs/codec.md)
EXTRA_VOICE_PLACES = 4      # voices that may be added while serving, by default (prefix.py's places: ~1.3 GB at the
                            # real size)


@dataclass(frozen=True)
class FlowOptions:
    """How the flow decodes (codec/decoder.py): tokens per block, latest tokens a block sees, Euler steps, CFG."""

    block_tokens: int = DEFAULT_BLOCK_TOKENS
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS
    n_timesteps: int | None = None     # None: the checkpoint's (10)
    cfg_rate: float | None = None      # None: the checkpoint's (0.7)
    history_streams: int | None = None  # streams whose solved frames are kept (codec/history.py); None: as many as
                                        # fit in the device's free memory, up to DEFAULT_HISTORY_STREAMS
    history_frames: int = DEFAULT_RING_FRAMES        # each one's latest frames kept
    encoder_window: int = 0            # with a history, its encoder state kept, reading this many positions (0: off)
    max_voices: int | None = None      # voices in all, those added while serving included (None: the voices given
                                       # and EXTRA_VOICE_PLACES more; prefix.py: ~321 MB a place at the real size)


# The codec's modules built on the CPU ahead of a start, by (directory, preset, seed): a spare's (read_ahead.py).
CODEC = ReadAhead("the vocoder's codec")


def codec_ahead(directory: str | Path | None, preset: str, seed: int) -> bool:
    """Read (or build, for a preset) the codec's flow and HiFT on the CPU now, for load_vocoder's next call with the
    same arguments to take → whether there is a codec to read. Touches no GPU."""
    return CODEC.read(_codec_key(directory, preset, seed), lambda: _cpu_codec(directory, preset, seed))


def _codec_key(directory: str | Path | None, preset: str, seed: int) -> tuple:
    return str(directory) if directory is not None else None, preset, seed


def _cpu_codec(directory: str | Path | None, preset: str, seed: int):
    """(flow, HiFT, config) on the CPU for a codec directory or a codec preset; None for the stand-in's."""
    if directory is not None and (Path(directory) / "codec.json").exists():
        return codec_checkpoint.load_codec(directory)
    if directory is None and preset in ("tiny-codec", "moss-speech"):
        cfg = codec_config.PRESETS["tiny" if preset == "tiny-codec" else "moss-speech"]()
        return (*codec_checkpoint.random_codec(cfg, seed), cfg)
    return None


def _take_codec(directory: str | Path | None, preset: str, seed: int):
    """The codec read ahead for these arguments (taken: once), else read now."""
    return CODEC.take(_codec_key(directory, preset, seed), lambda: _cpu_codec(directory, preset, seed))


def load_vocoder(directory: str | Path | None, preset: str = "tiny", device: str = "cpu", seed: int = 0,
                 voices_dir: str | Path | None = None, flow: FlowOptions = FlowOptions(),
                 generator: str = "hift") -> TokenVocoder:
    """From a directory, or a preset with random weights.

    A directory with codec.json (flow.pt, hift.pt) is the codec's decoder: flow + HiFT, or flow + the BigVGAN-v2
    of the same directory (config.json, bigvgan_generator.pt) with generator="bigvgan". A directory of BigVGAN
    files only is the stand-in's (token_decoder.json beside it, or a random one). voices_dir: the flow's voices
    (default: <directory>/voices; a preset without one gets a random "default" voice)."""
    dev = torch.device(device)
    if (codec := _take_codec(directory, preset, seed)) is not None and directory is not None:  # a codec directory
        flow_model, hift, cfg = codec
        kept = Path(voices_dir or Path(directory) / "voices")
        voices = load_voices(kept, cfg.flow)
        out = hift
        if generator == "bigvgan":
            out, _ = gen.load_generator(directory)
        return _codec_vocoder(flow_model, out, dev, voices, flow, kept)
    if codec is not None:  # a codec preset
        flow_model, hift, cfg = codec
        voices = (load_voices(voices_dir, cfg.flow) if voices_dir else
                  {DEFAULT: random_voice(cfg.flow, prompt_tokens=10 if preset == "tiny-codec" else DEFAULT_PROMPT_TOKENS,
                                         seed=seed)})
        log.warning("no --vocoder-dir: %r codec preset (flow + HiFT) with RANDOM weights (output is noise)", preset)
        return _codec_vocoder(flow_model, hift, dev, voices, flow, Path(voices_dir) if voices_dir else None)
    if directory is None:
        if preset not in PRESETS:
            raise ValueError(f"unknown vocoder preset {preset!r}; known: {', '.join(PRESETS)}")
        h = gen.preset_config(preset)
        decoder = _random_decoder_for(h, TINY_CODEBOOK, 64, seed)
        log.warning("no --vocoder-dir: %r vocoder preset with RANDOM weights (output is noise)", preset)
        return TokenVocoder(decoder, gen.build_generator(h, seed=seed), dev)
    generator_model, h = gen.load_generator(directory)
    if (Path(directory) / "token_decoder.json").exists():
        decoder = load_token_decoder(directory)
    else:
        decoder = _random_decoder_for(h, 16384, 512, seed)
        log.warning("%s has no token_decoder.json: using a RANDOM token decoder for %s", directory, gen.mel_format(h))
    return TokenVocoder(decoder, generator_model, dev)


def _voice_places(options: FlowOptions, voices: dict) -> int:
    """Voices the prompt prefix holds in all: --max-voices, or those given and EXTRA_VOICE_PLACES more; never fewer
    than those given."""
    return max(len(voices), options.max_voices if options.max_voices is not None else len(voices) + EXTRA_VOICE_PLACES)


def _codec_vocoder(flow_model, generator, device: torch.device, voices: dict[str, Voice], options: FlowOptions,
                   kept: Path | None) -> TokenVocoder:
    """The codec's vocoder on `device`, the steps of its start timed in the log: after a fault every GPU stage starts
    at once, and beside the others' starts these took an H200's vocoder 8.4 s, against 2.4 s alone (2026-11-30)."""
    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    started = now()
    decoder = _flow_decoder(flow_model, device, options)
    moved = now()
    vocoder = TokenVocoder(decoder, generator, device, voices, _voice_places(options, voices), kept)
    log.info("vocoder: the flow moved to %s in %.1f s; the voices' prompt prefix, the stream history and the generator "
             "set up in %.1f s", device, moved - started, now() - moved)
    return vocoder


def _flow_decoder(flow_model, device: torch.device, options: FlowOptions) -> FlowTokenDecoder:
    return FlowTokenDecoder(flow_model, device, block_tokens=options.block_tokens,
                            max_context_tokens=options.max_context_tokens, n_timesteps=options.n_timesteps,
                            cfg_rate=options.cfg_rate, history_streams=options.history_streams,
                            history_frames=options.history_frames, encoder_window=options.encoder_window)


def _random_decoder_for(h, codebook_size: int, embed_dim: int, seed: int) -> TokenDecoder:
    """A random token decoder producing the mel format the BigVGAN config `h` consumes."""
    mel = gen.mel_format(h)
    cfg = TokenDecoderConfig(codebook_size=codebook_size, num_mels=mel.num_mels, sampling_rate=mel.sampling_rate,
                             hop_size=mel.hop_size, embed_dim=embed_dim)
    return random_token_decoder(cfg, seed=seed)
