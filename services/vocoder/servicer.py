"""moss.speech.v1.Vocoder: one config message, token chunks, end → PCM chunks as each is ready.

The model runs on one worker thread shared by all streams (worker.py), which vocodes the chunks that are
ready together, earliest deadline first (a playing stream's when its listener would run out of audio);
the event loop only awaits futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from moss.speech.v1 import vocoder_pb2, vocoder_pb2_grpc

from services.common.audio import encode_pcm, resolve_format
from services.common.errors import DeviceLost, FailedPrecondition, InvalidArgument
from services.common.recording import MIN_VOICE_SECONDS
from services.common.sampling import resolve_lookahead, resolve_playback_speed
from services.vocoder import metrics
from services.vocoder.capture import exclusive
from services.vocoder.pipelined_worker import PipelinedWorker
from services.vocoder.solve_worker import DEFAULT_ADMIT_EVERY, DEFAULT_GENERATE_WAIT, SolveWorker
from services.vocoder.streamer import MelStreamer
from services.vocoder.vocoder import TokenVocoder
from services.vocoder.worker import (
    DEFAULT_FIRST_CHUNK_BATCH_FRAMES,
    DEFAULT_FIRST_CHUNK_BUDGET,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BATCH_FRAMES,
    FIRST_CHUNK_LANE_BATCH,
    Done,
    Job,
    Lanes,
    VocoderWorker,
)

MAX_TOKENS_PER_MESSAGE = 4096
MEL_BANDS = 80  # a voice's prompt mel: [4 x prompt tokens, 80] (codec/voice.py)
log = logging.getLogger(__name__)

VOICE_NICE = 10  # the thread that makes voices, below the workers (nice 0)
AFTER_END_GRACE_SECONDS = 1.0  # how long a stream waits, its audio all sent, for the client to half-close


def lower_priority() -> None:
    """This thread VOICE_NICE below the process's priority, so that the scheduler serves the workers' threads first
    (Linux: a thread's nice is its own, and threads it starts inherit it)."""
    with contextlib.suppress(OSError, AttributeError):
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + VOICE_NICE))


def warm_up_voices(speaker_model: str) -> None:
    from services.voice_maker import warm_up

    try:
        log.info("vocoder: ready to make voices (%.2f s: the speaker model, the mel's basis)", warm_up(speaker_model))
    except Exception as err:  # noqa: BLE001  (AddVoice says it again, to its caller)
        log.warning("vocoder: --speaker-model %s cannot make an x-vector: %s", speaker_model, err)


class VocoderServicer(vocoder_pb2_grpc.VocoderServicer):
    def __init__(self, vocoder: TokenVocoder, left_context: int | None = None, lookahead: int | None = None,
                 max_batch: int = DEFAULT_MAX_BATCH, max_wait: float = 0.002,
                 max_batch_frames: int = DEFAULT_MAX_BATCH_FRAMES, first_chunk_budget: float = DEFAULT_FIRST_CHUNK_BUDGET,
                 first_chunk_batch_frames: int = DEFAULT_FIRST_CHUNK_BATCH_FRAMES,
                 lost: Callable[[], bool] = lambda: False, on_fatal: Callable[[DeviceLost], None] = lambda err: None,
                 lane: TokenVocoder | None = None, solve=None, admit_every: int = DEFAULT_ADMIT_EVERY,
                 generate_wait: float = DEFAULT_GENERATE_WAIT, gate=None, speaker_model: str | None = None,
                 urgent_seconds: float = 0.0, overlap: bool = False):
        """left_context / lookahead in mel frames: None takes MelStreamer's defaults. max_batch windows per
        model call, holding at most max_batch_frames mel frames; a chunk waits at most max_wait seconds for
        others to join it; a first chunk is due first_chunk_budget seconds after it comes in, in a call of at most
        first_chunk_batch_frames (worker.py); a call led by a chunk due within urgent_seconds (> 0) takes only
        such chunks (the playing streams' worker).
        lost / on_fatal: what the worker does when its device is lost (worker.py).
        lane: the vocoder's lane (TokenVocoder.lane) that first chunks run on, beside the other calls; None: one worker.
        solve: the flow's FlowSolve, driven by a SolveWorker (solve_worker.py; admit_every ticks between admissions of
        chunks not yet urgent, generate_wait seconds such a chunk may wait for a generator call); None: flow calls
        (worker.py).
        gate: the capture.DeviceGate the flow-call workers' device work goes through (graphs captured while serving,
        voices added: capture.py); None: none (the stand-in decoder, the solve).
        speaker_model: the speaker-embedding model in ONNX (CAM++) AddVoice makes a recording's x-vector with.
        overlap: the playing streams' calls pipelined, each call's generator beside the next call's token decoder
        (pipelined_worker.py)."""
        self.vocoder, self.gate, self.speaker_model = vocoder, gate, speaker_model
        metrics.watch_voices(vocoder)
        # A voice's CPU work (the recording's mel, fbank and x-vector) runs one voice at a time on a thread of its own
        # below the workers' priority, so that it yields the cores to the streams playing.
        self.voice_thread = ThreadPoolExecutor(1, thread_name_prefix="vocoder-voices", initializer=lower_priority)
        if speaker_model is not None:  # (the first voice then waits for none of it)
            self.voice_thread.submit(warm_up_voices, speaker_model)
        self.left_context, self.lookahead = left_context, lookahead
        common = dict(max_wait=max_wait, on_batch=metrics.observe_batch, on_decode=metrics.observe_token_decode,
                      on_generate=metrics.observe_generate, on_nonfinite=metrics.observe_nonfinite,
                      lost=lost, on_fatal=on_fatal)
        if solve is not None:
            self.worker = SolveWorker(vocoder, solve, admit_every=admit_every, generate_wait=generate_wait,
                                      on_solve=metrics.observe_solve,
                                      first_chunk_budget=first_chunk_budget, **common)
            return
        playing = PipelinedWorker if overlap else VocoderWorker
        self.worker = playing(vocoder, max_batch, max_batch_frames=max_batch_frames, first_chunk_budget=first_chunk_budget,
                              first_chunk_batch_frames=first_chunk_batch_frames, gate=gate,
                              urgent_seconds=urgent_seconds, **common)
        if lane is not None:
            first = VocoderWorker(lane, FIRST_CHUNK_LANE_BATCH, max_batch_frames=max_batch_frames, first_chunk_budget=0,
                                  first_chunk_batch_frames=0, name="vocoder-first-chunks", gate=gate,
                                  **common | dict(on_batch=metrics.observe_lane_batch))
            self.worker = Lanes(self.worker, first)

    def _check_tokens(self, tokens) -> list[int]:
        if len(tokens) > MAX_TOKENS_PER_MESSAGE:
            raise InvalidArgument("tokens.tokens", f"at most {MAX_TOKENS_PER_MESSAGE} tokens per message, got {len(tokens)}")
        bad = [t for t in tokens if not 0 <= t < self.vocoder.codebook_size]
        if bad:
            raise InvalidArgument("tokens.tokens", f"codes must be in [0, {self.vocoder.codebook_size}), got {bad[0]}")
        return list(tokens)

    async def _vocode(self, streamer: MelStreamer, tokens: list[int] | None, started: float | None,
                      sent: float) -> Done:
        """Hand a chunk (or the end, tokens None) to the worker and await its samples. sent: seconds of audio sent,
        on the listener's clock (its playback speed): the chunk's slack counts from it (worker.py)."""
        return await asyncio.wrap_future(self.worker.submit(Job(streamer, tokens, started, sent)))

    @staticmethod
    async def _expect_no_more(request_iterator) -> None:
        """After `end` only the client's half-close may come: a message is an error (its audio has all been
        sent); a client that keeps its side open is let go after a grace period, never waited on for longer."""
        try:
            extra = await asyncio.wait_for(anext(aiter(request_iterator), None), AFTER_END_GRACE_SECONDS)
        except TimeoutError:
            return
        if extra is not None:
            raise InvalidArgument(extra.WhichOneof("kind") or "kind", "no message may follow end")

    async def ListVoices(self, request, context):
        history = getattr(self.vocoder.decoder, "history", None)
        flow = self.vocoder.voices  # (the stand-in decoder speaks in none: no prompt, no limit)
        return vocoder_pb2.ListVoicesResponse(voices=self.vocoder.voice_names(),
                                              stream_slots=history.streams if history is not None else 0,
                                              max_prompt_seconds=self.vocoder.max_prompt_seconds if flow else 0.0,
                                              max_voices=(self.vocoder.voice_places or 0) if flow else 0)

    async def AddVoice(self, request, context):
        if request.recording and self.speaker_model is None:
            raise FailedPrecondition("this vocoder was started without --speaker-model: it cannot make a voice's "
                                     "x-vector from a recording (give prompt_mel and embedding, or start it with one)")
        # (the mel, the x-vector and the prefix are made off the event loop: seconds at the real size)
        loop = asyncio.get_running_loop()
        voice = await loop.run_in_executor(self.voice_thread, voice_of, request, self.speaker_model, self.vocoder)
        # (at the workers' priority: it holds the device from them, so it must not wait on the scheduler meanwhile)
        fast, kept = await asyncio.to_thread(self._add_voice, voice)
        return vocoder_pb2.AddVoiceResponse(fast=fast, kept=kept)

    async def RemoveVoice(self, request, context):
        self.vocoder.remove_voice(request.name)
        return vocoder_pb2.RemoveVoiceResponse()

    def _add_voice(self, voice) -> tuple[bool, bool]:
        # Alone on the device: the voice's prefix is recorded by the flow's own modules, which the workers' calls run
        # too, and no graph is captured meanwhile (capture.py). At the real size the calls wait ~0.3 s, less than the
        # audio a playing stream has ahead.
        with exclusive(self.gate):
            began = time.perf_counter()
            added = self.vocoder.add_voice(voice)
            metrics.observe_voice_add(time.perf_counter() - began)
            return added

    async def Vocode(self, request_iterator, context):
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "config":
            raise InvalidArgument("config", "the first message of a Vocode stream must be a config")
        fmt = resolve_format(first.config.format, "config.format")
        lookahead = resolve_lookahead(first.config, "config")  # this stream's trade of latency for exactness
        speed = resolve_playback_speed(first.config, "config")  # the listener's clock, for each chunk's slack
        rate = self.vocoder.sample_rate
        try:
            streamer = MelStreamer(self.vocoder, self.left_context, self.lookahead if lookahead is None else lookahead,
                                   voice=first.config.voice)
        except InvalidArgument as err:
            raise err.within("config") from None
        stats = vocoder_pb2.VocodeStats()
        offset = 0
        first_tokens_at: float | None = None
        audio_started: float | None = None  # when the first samples went out: the listener's clock

        def message(samples: np.ndarray, final: bool) -> vocoder_pb2.VocodeResponse:
            nonlocal offset
            msg = vocoder_pb2.VocodeResponse(pcm=encode_pcm(samples, fmt), sample_offset=offset,
                                             num_samples=len(samples), sample_rate=rate, format=fmt, final=final)
            offset += len(samples)
            return msg

        metrics.ACTIVE_STREAMS.inc()
        try:
            yield message(np.zeros(0, np.float32), final=False)  # header: rate and format, no samples
            async for req in request_iterator:
                kind = req.WhichOneof("kind")
                if kind == "end":
                    break
                if kind != "tokens":
                    raise InvalidArgument(kind or "kind", "only tokens or end may follow the config")
                tokens = self._check_tokens(req.tokens.tokens)
                if not tokens:
                    continue
                tokens_at = time.perf_counter()
                first_tokens_at = first_tokens_at or tokens_at
                done = await self._vocode(streamer, tokens, audio_started, offset / rate / speed)
                stats.chunks += 1
                stats.tokens += len(tokens)
                stats.compute_seconds += done.compute_seconds
                stats.queue_seconds += done.queue_seconds
                metrics.observe_chunk(done.queue_seconds, done.compute_seconds)
                if len(done.samples):
                    if audio_started is None:  # the stream's first audio
                        audio_started = time.perf_counter()
                        stats.first_chunk_compute_seconds = done.compute_seconds
                        stats.first_chunk_queue_seconds = done.queue_seconds
                        stats.first_chunk_seconds = audio_started - first_tokens_at
                        metrics.observe_first_chunk(stats.first_chunk_seconds)
                    elif not stats.second_chunk_seconds:  # (not yet set: this is the stream's second audio)
                        second_chunk(stats, done, tokens_at)
                    yield message(done.samples, final=False)
            tokens_at = time.perf_counter()
            done = await self._vocode(streamer, None, audio_started, offset / rate / speed)
            if len(done.samples) and audio_started is not None and not stats.second_chunk_seconds:  # (the end made it)
                second_chunk(stats, done, tokens_at)
            stats.compute_seconds += done.compute_seconds
            stats.queue_seconds += done.queue_seconds
            final = message(done.samples, final=True)
            final.stats.CopyFrom(stats)
            metrics.observe_audio(offset / rate)
            yield final
            await self._expect_no_more(request_iterator)
        finally:
            streamer.close()
            metrics.ACTIVE_STREAMS.dec()


def second_chunk(stats: vocoder_pb2.VocodeStats, done: Done, tokens_at: float) -> None:
    """The stream's second audio, which its listener waits for with the first one's only: its figures in stats."""
    stats.second_chunk_compute_seconds = done.compute_seconds
    stats.second_chunk_queue_seconds = done.queue_seconds
    stats.second_chunk_seconds = time.perf_counter() - tokens_at


def voice_of(request: vocoder_pb2.AddVoiceRequest, speaker_model: str | None, vocoder: TokenVocoder):
    """An AddVoice request → a Voice (the vocoder checks it against its flow), or InvalidArgument naming the field. A
    recording is made a voice as `moss-serve voice` makes one (services/voice_maker.py), from the codes given."""
    import torch

    from services.vocoder.codec.voice import Voice, VoiceError

    if request.recording:
        from services.common.recording import RecordingError
        from services.voice_maker import voice_from

        if len(request.recording) % 2 or not request.recording_rate:
            raise InvalidArgument("recording", "16-bit PCM at recording_rate Hz (an even number of bytes, a rate)")
        if not request.prompt_tokens:
            raise InvalidArgument("prompt_tokens", "the recording's codes (the encoder's) are needed with it")
        samples = np.frombuffer(request.recording, dtype="<i2").astype(np.float32) / 32768
        try:
            return voice_from(request.name, torch.tensor(list(request.prompt_tokens), dtype=torch.long), samples,
                              request.recording_rate, speaker_model, vocoder.decoder.flow.cfg,
                              max_seconds=vocoder.max_prompt_seconds, min_seconds=MIN_VOICE_SECONDS)
        except RecordingError as err:
            raise InvalidArgument("recording", str(err)) from None
        except VoiceError as err:
            raise InvalidArgument("voice", str(err)) from None
    if len(request.prompt_mel) % (4 * MEL_BANDS):
        raise InvalidArgument("prompt_mel", f"{len(request.prompt_mel)} bytes are not rows of {MEL_BANDS} float32")
    mel = np.frombuffer(request.prompt_mel, dtype="<f4").reshape(-1, MEL_BANDS)
    return Voice(request.name, torch.tensor(list(request.prompt_tokens), dtype=torch.long), torch.from_numpy(mel.copy()),
                 torch.tensor(list(request.embedding), dtype=torch.float32))
