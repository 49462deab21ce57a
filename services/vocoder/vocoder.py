"""A token decoder and a generator: audio tokens → mel → waveform, for one model instance.

Two pairs are served (docs/codec.md):
- the MOSS-Speech codec's own: the flow-matching token decoder (codec/decoder.py) and HiFT (codec/hift.py), or
  the flow and a BigVGAN-v2 trained on its mel format; voices (codec/voice.py) condition the flow;
- the stand-in: a small causal token decoder with random weights (token_decoder.py) and BigVGAN-v2, for the
  `tiny` preset only. It speaks in no voice ("default" is its only name).

Built from the user's files or a preset by loader.py.
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from services.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, echo, listed
from services.vocoder import generator as gen
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.hift import HiFTGenerator
from services.vocoder.codec.hift import receptive_field as hift_receptive_field
from services.vocoder.codec.voice import DEFAULT, NAME, Voice, VoiceError, check, save_voice
from services.vocoder.receptive_field import receptive_field
from services.vocoder.runner import GeneratorRunner
from services.vocoder.token_decoder import DecoderState, TokenDecoder


class MelFormatMismatch(ValueError):
    pass


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

    def decode_seconds(self, timing=None) -> float:
        """The last mel_chunks pass's seconds, or those of the pass whose decode_timing() is given (on CUDA its device
        time: waits for it to finish)."""
        timing = self._decode_timing if timing is None else timing
        if isinstance(timing, tuple):
            timing[1].synchronize()
            return timing[0].elapsed_time(timing[1]) / 1000
        return timing

    def decode_timing(self):
        """The last mel_chunks pass's timing, for decode_seconds() once later passes have run."""
        return self._decode_timing

    def wait_decoded(self, timing) -> None:
        """Until the mel_chunks pass of this decode_timing() is done on the device (at once elsewhere)."""
        if isinstance(timing, tuple):
            timing[1].synchronize()

    def overlap_generator(self) -> None:
        """On CUDA, the generator's calls on a stream of their own, each after the mel it reads: a call's generator
        then runs beside the next call's token decoder (pipelined_worker.py). Nothing elsewhere."""
        if self.device.type == "cuda":
            self.runner.stream = torch.cuda.Stream(self.device)

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
