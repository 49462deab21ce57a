"""A voice's prompt prefix through the flow, computed once: the frames every call of that voice solves again.

Each flow call decodes [prompt | window] (decoder.py), and in streaming mode a frame depends on its own
attention chunk and the ones before it only (the estimator's convolutions are causal, its norms per frame, the
encoder reads 3 tokens ahead). So the prompt's first whole chunks that end at least `pre_lookahead_len` tokens
before the prompt does are the same in every call of a voice: the same tokens, mel, x-vector and noise give
the same trajectory through the 10 Euler steps, in both halves of the CFG pair. At the published sizes with a
prompt of 40 tokens that is 140 of a saturated call's 320 frames per row, and 140 of the 192 of a first block's.

`PromptPrefix` records, per voice, at every Euler step and for both CFG rows, what later frames read of those
frames: each attention's keys and values and each causal convolution's last input frames. A call then runs the
estimator on the frames after the prefix only, its attention reading the prefix's keys and values before its own
(chunk_attention.py: on CUDA straight from this cache, by each row's voice) and its convolutions the prefix's
frames before its first. The mel of the frames after the prefix is what the
whole call gives (tests/test_codec_prefix.py). The prefix is as long for every voice: the shortest voice's.

**A voice added while serving** (`add`) takes a free place of `capacity`, kept from the start, so that no tensor a
captured graph reads changes its shape or place: its rows are recorded on the side, and the voice is told apart
(`covers`) only once they are written. A place whose voice was removed (`retire`) is free again once no stream of
that voice reads it (the decoder tells the prefix each stream's start and end). A voice must reach as far as the
prefix (its prompt no shorter than the shortest voice's at the start); one that does not, or that finds every place
taken, is solved whole, over its window, as any voice outside the prefix is.

Memory: per voice place, 2 x steps x (2 x heads x head_dim x frames per attention); at the real size with a 40-token
prompt, 56 attentions, 10 steps, 140 frames: 321 MB in bf16.
"""

from __future__ import annotations

import math
import threading

import torch

from services.vocoder.codec.estimator import Attention, CausalConv1d
from services.vocoder.codec.flow import CausalMaskedDiffWithXvec, FlowBatch
from services.vocoder.codec.voice import Voice


def stand_in(voice: Voice, tokens: int) -> Voice:
    """A voice of `tokens` prompt codes made of `voice`'s, repeated: shapes to run the flow over, nothing to hear."""
    reps = -(-tokens // len(voice.prompt_tokens))
    return Voice(f"{voice.name}-stand-in", voice.prompt_tokens.repeat(reps)[:tokens],
                 voice.prompt_mel.repeat(reps, 1)[: tokens * voice.prompt_mel.shape[0] // len(voice.prompt_tokens)],
                 voice.embedding)


def prefix_frames(flow: CausalMaskedDiffWithXvec, voices: list[Voice]) -> int:
    """Mel frames of every voice's prompt that no later token reaches (0: none, or a U-Net of several levels)."""
    cfg = flow.cfg
    if not voices:
        return 0
    ratio, est_chunk = cfg.token_mel_ratio, cfg.estimator.static_chunk_size
    if est_chunk % ratio:
        return 0
    chunk = math.lcm(est_chunk // ratio, cfg.encoder.static_chunk_size)       # tokens: whole chunks of both
    tokens = min(len(v.prompt_tokens) for v in voices) - cfg.pre_lookahead_len
    return max(0, tokens // chunk * chunk) * ratio


class PromptPrefix:
    recording = False

    def __init__(self, flow: CausalMaskedDiffWithXvec, voices: list[Voice], capacity: int | None = None,
                 record: bool = True):
        """capacity: voices it may hold, those added later (`add`) included (default: these alone). record=False:
        its places only, the voices recorded by `record(flow)` (what is sized from the places first: decoder.py)."""
        self.frames = prefix_frames(flow, voices)
        self.voices = list(voices)
        self.index = {id(v): i for i, v in enumerate(voices)}
        self.capacity = max(len(voices), capacity or 0)
        # A place is a new voice's once its voice was removed (`retire`) and no stream reads it any more: the streams
        # that read a place, by id (`opened`, `closed`: on any thread, under the lock).
        self.readers: dict[int, Voice] = {}
        self.retired: list[Voice] = []
        self.lock = threading.Lock()
        estimator = flow.decoder.estimator
        p = next(flow.parameters())
        steps, rows = flow.decoder.n_timesteps, 2 * self.capacity    # rows: voice i's CFG pair at 2i, 2i + 1
        self.steps = steps
        # keys[slot], values[slot]: [steps, rows, heads, frames, head_dim]
        # (every attention's in one tensor [attentions, steps, ...]: a run of them reads slot i at a fixed stride,
        # megakernel.py)
        attns = estimator.slots(Attention)
        shape = (len(attns), steps, rows, attns[0].heads, self.frames, attns[0].to_q.out_features // attns[0].heads)
        self.keys, self.values = list(p.new_zeros(shape).unbind(0)), list(p.new_zeros(shape).unbind(0))
        # lefts[slot]: [steps, rows, kernel - 1, in channels]
        self.lefts = [p.new_zeros(steps, rows, conv.kernel_size[0] - 1, conv.in_channels)
                      for conv in estimator.slots(CausalConv1d)]
        if record:
            self.record(flow)

    def record(self, flow: CausalMaskedDiffWithXvec) -> None:
        """Run the voices' prompts through the flow into their places (16 s at the real size on a 2-core CPU)."""
        voices = self.voices
        if self.frames:
            for i, voice in enumerate(voices):
                self._record(flow, voice, i)
            if self.capacity > len(voices):
                # A free place recorded once, unpublished (`add` writes it again): a voice added while serving records
                # its prompt alone on the device, its calls held meanwhile, and a first prompt of another length had
                # Triton compile its kernels for that length's shapes then (4.1 s for the first voice made through the
                # API on an H200, 0.6 s for the next ones). An odd length: the shapes that no multiple of 16 divides.
                P = len(voices[0].prompt_tokens)
                self._record(flow, stand_in(voices[0], P + 1 + P % 2), len(voices))

    def __bool__(self) -> bool:
        return self.frames > 0

    def covers(self, voices) -> bool:
        return bool(self) and all(id(v) in self.index for v in voices)

    def opened(self, stream: int, voice: Voice) -> None:
        """A stream in `voice` started: its place is read until `closed(stream)`."""
        with self.lock:
            self.readers[stream] = voice

    def closed(self, stream: int) -> None:
        """The stream is gone (more than once is as once)."""
        with self.lock:
            self.readers.pop(stream, None)

    def retire(self, voice: Voice) -> None:
        """No stream starts in the voice from now on (the caller sees to it): its place is free for `add` once the
        streams reading it have ended."""
        if self.covers([voice]):
            with self.lock:
                self.retired.append(voice)

    def _free_places(self) -> list[int]:
        """The places of retired voices that no stream reads."""
        with self.lock:
            read = {id(v) for v in self.readers.values()}
            return [self.index[id(v)] for v in self.retired if id(v) not in read and id(v) in self.index]

    @torch.inference_mode()
    def add(self, flow: CausalMaskedDiffWithXvec, voice: Voice, copies: tuple = ()) -> bool:
        """Record a voice into a free place → whether it now reads the prefix (False: no place left, or its prompt
        ends before the prefix does; module docstring): one never used, else one a retired voice's streams have left.
        copies: callables told the place (copy_voice(i)) to copy what they keep of it (history.py), before it is
        found. Its rows are written, and the device has finished writing them, before any call can find it: calls on
        other threads and CUDA streams read the other places meanwhile."""
        if id(voice) in self.index:
            return True
        places = self._free_places() if len(self.voices) >= self.capacity else []
        if not self or (len(self.voices) >= self.capacity and not places) or prefix_frames(flow, [voice]) < self.frames:
            return False
        i = len(self.voices) if len(self.voices) < self.capacity else places[0]
        self._record(flow, voice, i)
        for copy in copies:
            copy(i)
        if self.keys[0].is_cuda:
            torch.cuda.current_stream(self.keys[0].device).synchronize()
        if i < len(self.voices):  # (the place's voice before: gone from the index, nothing reads it)
            old = self.voices[i]
            del self.index[id(old)]
            self.voices[i] = voice
            with self.lock:
                self.retired.remove(old)
        else:
            self.voices.append(voice)
        self.index[id(voice)] = i  # (published last: `covers` reads it)
        return True

    def voice_index(self, voice: Voice) -> int:
        return self.index[id(voice)]

    @torch.inference_mode()
    def _record(self, flow: CausalMaskedDiffWithXvec, voice: Voice, i: int) -> None:
        """Run the voice's prompt alone through the flow (no look-ahead: it reaches no prefix frame), keeping what
        later frames read of the first `frames` frames."""
        p = next(flow.parameters())
        P = len(voice.prompt_tokens)
        batch = FlowBatch(voice.prompt_tokens[None].to(p.device), torch.tensor([P], device=p.device),
                          torch.tensor([0], device=p.device), voice.prompt_mel[None].to(p),
                          torch.tensor([voice.prompt_frames], device=p.device), voice.embedding[None].to(p),
                          torch.tensor([0], device=p.device))
        flow(batch, streaming=True, prefix=Recorder(self, i))

    def view(self, voice_index: torch.Tensor) -> "PrefixView":
        """voice_index [B] (each row's voice) → what a call of those rows reads (cond rows, then free rows)."""
        return PrefixView(self, torch.cat([2 * voice_index, 2 * voice_index + 1]))


class StepRows:
    """What a view of kept tensors (stacked [steps, R, ...] by Euler step) shares: the step the solver is at, one for
    every row (an int) or each row's own ([B] long: a solve whose rows are at different steps, flow.py's solve_step),
    and each row's place among the R at it. Per-row places (step·R + row) are made once per step and kind of tensor,
    not in each of the estimator's 56 attentions and 16 convolutions (~400 small kernels a pass)."""

    def __init__(self):
        self._step, self._flat = 0, {}

    @property
    def step(self):
        return self._step

    @step.setter
    def step(self, value) -> None:
        self._step, self._flat = value, {}

    def at_step(self, stacked: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """stacked [steps, R, ...] and rows [B] (each row's place among the R) → what the rows read at their step:
        ([R, ...], rows) at one step, or ([steps·R, ...], step·R + row) at each row's own."""
        if isinstance(self._step, int):
            return stacked[self._step], rows
        key = (id(rows), stacked.shape[1])
        if key not in self._flat:
            self._flat[key] = self._step * stacked.shape[1] + rows
        return stacked.flatten(0, 1), self._flat[key]


class PrefixView(StepRows):
    """The prefix as a call's estimator reads it: row r's is its voice's, at the Euler step the solver is at (`step`:
    an int, or each row's own, [B] long)."""

    def __init__(self, cache: PromptPrefix, rows: torch.Tensor):
        super().__init__()
        self.cache, self.rows = cache, rows

    def kv(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> dict:
        """What an attention reads before the call's keys and values (chunk_attention's arguments): the prefix's
        [R, heads, frames, d] at this step, and each row's place in them [B]."""
        keys, rows = self.at_step(self.cache.keys[slot], self.rows)
        return dict(prefix=(keys, self.at_step(self.cache.values[slot], self.rows)[0], rows))

    def keep(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Nothing of a call's own frames is kept (history.py keeps them)."""

    def left(self, slot: int, x: torch.Tensor, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What a convolution reads before its input's first frame: the prefix's last frames [R, frames, C] at this
        step, and each row's place in them [B] (frame_ops.causal_unfold)."""
        return self.at_step(self.cache.lefts[slot], self.rows)


class Recorder:
    """Prefix-recording mode: the estimator runs over the whole prompt as usual; its first frames are kept."""

    recording = True

    def __init__(self, cache: PromptPrefix, voice: int):
        self.cache, self.at, self.step = cache, slice(2 * voice, 2 * voice + 2), 0

    def kv(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> dict:
        """Keeps the whole prompt's first keys and values; the attention reads no prefix before them."""
        n = self.cache.frames
        self.cache.keys[slot][self.step][self.at] = k[:, :, :n]
        self.cache.values[slot][self.step][self.at] = v[:, :, :n]
        return {}

    def keep(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """(Kept by kv.)"""

    def left(self, slot: int, x: torch.Tensor, frames: int) -> None:
        """Keeps the prefix's last input frames; the convolution reads zeros before the prompt, as usual."""
        n = self.cache.frames
        self.cache.lefts[slot][self.step][self.at] = x[:, n - frames : n]
