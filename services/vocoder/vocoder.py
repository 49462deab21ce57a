"""A token decoder and a generator: audio tokens → mel → waveform, for one model instance.

Two pairs are served (docs/codec.md):
- the MOSS-Speech codec's own: the flow-matching token decoder (codec/decoder.py) and HiFT (codec/hift.py), or
  the flow and a BigVGAN-v2 trained on its mel format; voices (codec/voice.py) condition the flow;
- the stand-in: a small causal token decoder with random weights (token_decoder.py) and BigVGAN-v2, for the
  `tiny` preset only. It speaks in no voice ("default" is its only name).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from services.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, echo, listed
from services.common.read_ahead import ReadAhead
from services.vocoder import generator as gen
from services.vocoder.codec import checkpoint as codec_checkpoint
from services.vocoder.codec import config as codec_config
from services.vocoder.codec.decoder import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_MAX_CONTEXT_TOKENS,
    FlowTokenDecoder,
)
from services.vocoder.codec.hift import HiFTGenerator
from services.vocoder.codec.hift import receptive_field as hift_receptive_field
from services.vocoder.codec.history import DEFAULT_RING_FRAMES
from services.vocoder.codec.voice import DEFAULT, NAME, Voice, VoiceError, check, load_voices, random_voice, save_voice
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
PRESETS = ("tiny", "tiny-codec", "moss-speech")
DEFAULT_PROMPT_TOKENS = 40  # a random voice's prompt: 3.2 s, whole blocks (docs/codec.md)
EXTRA_VOICE_PLACES = 4      # voices that may be added while serving, by default (prefix.py's places: ~1.3 GB at the
                            # real size)


class MelFormatMismatch(ValueError):
    pass


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


def generator_format(generator: torch.nn.Module):
    return generator.cfg.mel_format if isinstance(generator, HiFTGenerator) else gen.mel_format(generator.h)


@dataclass
class TokenVocoder:
    decoder: TokenDecoder | FlowTokenDecoder
    generator: torch.nn.Module
    device: torch.device
    voices: dict[str, Voice] = field(default_factory=dict)  # the flow's; the stand-in speaks in none
    voice_places: int | None = None  # voices the flow's prompt prefix holds, those added later included (None: these)
    voices_dir: Path | None = None   # where its voices are kept (add_voice writes there); None: none, memory only
    _decode_timing: object = field(default=0.0, init=False, repr=False)  # mel_chunks': seconds, or CUDA events
    stream: object = field(default=None, init=False, repr=False)  # the CUDA stream its calls run on (None: current)

    def __post_init__(self):
        produced, consumed = self.decoder.cfg.mel_format, generator_format(self.generator)
        if produced != consumed:
            raise MelFormatMismatch(
                f"the token decoder produces mel frames of {produced} but the {self.generator_name} generator expects "
                f"{consumed}; use a generator trained for the token decoder's mel format")
        if isinstance(self.decoder, TokenDecoder):
            self.decoder.to(self.device)
        elif not self.voices:
            raise ValueError("the flow decoder needs at least one voice")
        else:
            self.decoder.set_voices(list(self.voices.values()), self.voice_places)
        hift = isinstance(self.generator, HiFTGenerator)
        conds = dict(cond_dtypes=(torch.float32, torch.long, torch.long, torch.long),
                     cond_shapes=((self.generator.m_source.harmonics,), (), (), ())) if hift else {}
        self.runner = GeneratorRunner(self.generator, self.hop_size, self.device,
                                      **(dict(fuse=False, channels_last=False) if hift else {}), **conds)

    def add_voice(self, voice: Voice, keep: bool = True) -> tuple[bool, bool]:
        """A voice for the streams that start from now on, while others play (the flow's decoder only) → (whether its
        streams take the fast path: the prompt prefix and a stream history, codec/decoder.py's add_voice; whether it
        was kept in voices_dir, so that a restarted vocoder has it again). InvalidArgument for a name that is not a
        voice name or a voice that does not fit the flow, AlreadyExists for a name taken, FailedPrecondition for the
        stand-in decoder, ResourceExhausted past voice_places voices (--max-voices). Its file is written first, under a name no start reads,
        and renamed into place once the voice is in: nothing half-made is left. A caller serving on other threads
        keeps any capture of a CUDA graph away meanwhile (capture.py's DeviceGate)."""
        if not isinstance(self.decoder, FlowTokenDecoder):
            raise FailedPrecondition("this vocoder's token decoder (the stand-in) speaks in no voice")
        if not NAME.match(voice.name):
            raise InvalidArgument("name", f"{echo(voice.name)} is not a voice name: 1-64 letters, digits, '_', '.' or "
                                          "'-', starting with a letter or digit")
        try:
            voice = check(voice, self.decoder.flow.cfg, f"voice {voice.name!r}")
        except VoiceError as err:
            raise InvalidArgument("voice", str(err)) from None
        if voice.name in self.voices:
            raise AlreadyExists(f"voice {voice.name!r} exists already")
        if self.voice_places is not None and len(self.voices) >= self.voice_places:
            raise ResourceExhausted(f"this vocoder holds its most voices, {self.voice_places} (--max-voices); remove "
                                    "one first")
        if len(voice.prompt_tokens) > (most := self.decoder.max_prompt_tokens):
            raise InvalidArgument("prompt_tokens", f"{len(voice.prompt_tokens)} codes; a voice's prompt is at most "
                                                   f"{most} codes ({most / self.decoder.tokens_per_second:.2f} s: what the "
                                                   "flow's CUDA graphs take)")
        part = None
        if keep and self.voices_dir is not None:
            try:
                part = save_voice(voice, self.voices_dir, Path(self.voices_dir) / f".{voice.name}.safetensors.part")
            except OSError as err:  # (a read-only directory: the codec's own, mounted so)
                raise FailedPrecondition(f"cannot keep the voice in {self.voices_dir} ({err.strerror or err}): give the "
                                         "vocoder a voices directory it may write (--voices-dir)") from None
        try:
            fast = self.decoder.add_voice(voice)
            if part is not None:
                part.replace(Path(self.voices_dir) / f"{voice.name}.safetensors")
        except BaseException:
            if part is not None:
                part.unlink(missing_ok=True)
            raise
        self.voices[voice.name] = voice  # (last: a stream may ask for it from now on)
        return fast, part is not None

    def lane(self) -> "TokenVocoder":
        """The same vocoder for a second worker thread (worker.py's first-chunk lane): models, voices and the flow's
        stream history shared; graphs of its own, and on CUDA a stream of its own of high priority, so that its
        small calls run beside the other thread's and its kernels go first."""
        other = copy.copy(self)
        other.decoder, other.runner = self.decoder.lane(), self.runner.lane()
        other._decode_timing = 0.0
        if self.device.type == "cuda":
            other.stream = torch.cuda.Stream(self.device, priority=-1)
        return other

    def serve(self) -> None:
        """Its warm-up is over and the worker threads start: from now on a call whose shape was not captured runs
        eagerly instead of being captured beside the other worker's calls (flow_graphs.py says why)."""
        self.runner.serving = True
        if (graphs := getattr(self.decoder, "graphs", None)) is not None:
            graphs.serving = True

    def running(self):
        """The context a worker thread calls this vocoder in: its CUDA stream, if it has one."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def remove_voice(self, name: str) -> None:
        """No new stream may name the voice, and its file leaves voices_dir; streams playing in it play on, and its
        place in the prompt prefix is a new voice's once they have ended (codec/prefix.py). NotFound for no such voice;
        FailedPrecondition for the default voice (a stream that names none takes it) or the last one."""
        if name not in self.voices:
            raise NotFound("name", f"no voice {echo(name)}; known voices: {listed(self.voice_names())}")
        if name == DEFAULT or len(self.voices) == 1:
            raise FailedPrecondition(f"voice {name!r} is the {'default' if name == DEFAULT else 'last'} voice: a stream "
                                     "that names none needs it")
        voice = self.voices.pop(name)
        self.decoder.remove_voice(voice)  # (its prefix place is free again once its streams have ended)
        if self.voices_dir is not None:
            (Path(self.voices_dir) / f"{name}.safetensors").unlink(missing_ok=True)

    @property
    def max_prompt_seconds(self) -> float:
        """The longest voice prompt add_voice takes (codec/decoder.py's max_prompt_tokens)."""
        return self.decoder.max_prompt_tokens / self.decoder.tokens_per_second

    @property
    def generator_name(self) -> str:
        return "HiFT" if isinstance(self.generator, HiFTGenerator) else "BigVGAN"

    @property
    def conditioned(self) -> bool:
        """The generator carries a stream's source phase from window to window (HiFT)."""
        return isinstance(self.generator, HiFTGenerator)

    @property
    def harmonics(self) -> int:
        return self.generator.m_source.harmonics

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
        if isinstance(self.generator, HiFTGenerator):
            return hift_receptive_field(self.generator.cfg)
        return receptive_field(self.generator.h)

    @property
    def samples_per_token(self) -> int:
        return self.decoder.cfg.samples_per_token

    @property
    def end_frames(self) -> tuple[int, ...]:
        """The mel frames a stream's end can bring, each a length its last window can have beyond the held-back
        look-ahead and its left context (the server captures graphs for them: runner.py)."""
        per_token = self.decoder.cfg.frames_per_token
        return tuple(range(0, (self.decoder.end_tokens + 1) * per_token, per_token))

    def voice_names(self) -> list[str]:
        return sorted(self.voices) if self.voices else [DEFAULT]

    def start(self, voice: str = "") -> DecoderState | object:
        """A stream's decoder state in this voice ("": the default), or InvalidArgument listing the known ones."""
        name = voice or DEFAULT
        if name not in self.voice_names():
            raise InvalidArgument("voice", f"unknown voice {echo(name)}; known voices: {listed(self.voice_names())}")
        return self.decoder.start(self.voices.get(name))

    def release(self, state) -> None:
        """A stream is gone, ended or not: what its decoder state holds is let go (a flow history slot)."""
        self.decoder.release(state)

    def mel(self, tokens: list[int], voice: str = "") -> torch.Tensor:
        """A whole stream's tokens decoded at once → log-mel [num_mels, len(tokens) * frames_per_token]."""
        state = self.start(voice)
        try:
            if isinstance(self.decoder, FlowTokenDecoder):  # offline: one final decode over every token
                return self.decoder.decode_chunks([(None, type(state)(state.voice, tuple(tokens), 0, 0))])[0][0]
            return self.decoder.decode_chunks([(tokens, state)])[0][0]
        finally:
            self.release(state)

    def mel_chunks(self, chunks: list[tuple[list[int] | None, object]]) -> list[tuple[torch.Tensor, object]]:
        """[(a stream's new tokens, or None at its end; its decoder state)] → [(log-mel [num_mels, n], next state)],
        every stream in one pass of the token decoder. Its time: decode_seconds()."""
        if self.device.type != "cuda":
            started = time.perf_counter()
            out = self.decoder.decode_chunks(chunks)
            self._decode_timing = time.perf_counter() - started
            return out
        # Events, not a synchronisation: the host prepares the generator's call while the device decodes.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.decoder.decode_chunks(chunks)
        end.record()
        self._decode_timing = (start, end)
        return out

    def decode_seconds(self) -> float:
        """The last mel_chunks pass's seconds (on CUDA its device time: waits for it to finish)."""
        timing = self._decode_timing
        if isinstance(timing, tuple):
            timing[1].synchronize()
            return timing[0].elapsed_time(timing[1]) / 1000
        return timing

    def vocode(self, windows: list[torch.Tensor], last: list[bool], conditions: list[tuple] | None = None) -> list:
        """Windows of mel [num_mels, F_i] (any streams) → float32 samples [F_i * hop] each, in [-1, 1];
        last[i]: window i ends its stream. With conditions (HiFT: streamer.py), (samples, [outputs]) each.
        Batched and padded as runner.py describes. (A config whose upsample kernels exceed their strides by an
        odd number, as the 24 kHz hop-480 BigVGAN preset's do, yields a few samples after the last frame's: they
        are cut.)"""
        return self.samples(self.launch(windows, last, conditions))

    def launch(self, windows: list[torch.Tensor], last: list[bool], conditions: list[tuple] | None = None):
        """vocode(), queued on the device without waiting for it → a runner.Generation for samples()."""
        return self.runner.launch(windows, last, conditions)

    @staticmethod
    def samples(generation) -> list:
        """A launched call's samples, as vocode() gives them (waits for the device)."""
        out = generation.result()
        return [wav.numpy() for wav in out] if not generation.conditioned else [(wav.numpy(), outs) for wav, outs in out]

    def waveform(self, mel: torch.Tensor) -> np.ndarray:
        """Offline synthesis: mel [num_mels, frames] → float32 samples [frames * hop] (HiFT: its source from the
        stream's start, the noise table from sample 0)."""
        if self.conditioned:
            return self.vocode([mel], [True], [self.stream_start_conditions(mel.shape[1])])[0][0]
        return self.vocode([mel], [True])[0]

    def stream_start_conditions(self, frames: int) -> tuple:
        """HiFT's inputs for a whole stream in one window: phase 0 at frame 0, noise from sample 0."""
        return (torch.zeros(self.harmonics), torch.tensor(0), torch.tensor(frames), torch.tensor(0))


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
