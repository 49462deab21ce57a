"""moss.speech.v1.Encoder: one config message, the user's audio as it is spoken, end → the turn's codes.

A call's audio is checked and resampled as it comes (speech_input.py). With speech detection, it first goes to the
voice-activity thread (vad.py: every listening speaker's windows in one call) and the speech gate (speech_gate.py),
which says what is speech; the encoder sees only that. The speech goes to the encoder's worker thread (worker.py:
every speaker's new audio in one model call), so the codes are ready moments after the turn ends. The event loop only
awaits futures. A call that ends any other way than with its codes (an error, a cancel, the client gone) gives its
speaker's place back through the worker (never under a model call that may still write to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import torch
from moss.speech.v1 import encoder_pb2, encoder_pb2_grpc

from services.common.errors import InvalidArgument, ResourceExhausted, ServiceError
from services.encoder import metrics
from services.encoder.config import SAMPLE_RATE
from services.encoder.kv_pool import KVPool, PoolFull
from services.encoder.settings import EncoderSettings
from services.encoder.speech_gate import SpeechGate
from services.encoder.speech_input import SpeechInput, check_end_silence
from services.encoder.stream import EncoderStream
from services.encoder.vad import VadStream, VadWorker
from services.encoder.whisper_vq import WhisperVQEncoder
from services.encoder.worker import EncoderWorker, Job

RETRY_AFTER_SECONDS = 1.0   # a refused speaker's hint: turns last seconds
REFUSED_SECONDS = 5.0      # a refused call's client has this long to let go before the status ends the call
LISTEN_SECONDS = 3600.0     # with detection, audio a call may send in all (its speech is bounded by max_turn_seconds)


class Turn:
    """One call's turn: its audio in, its speech (all of it, or what the gate lets through) to the encoder."""

    def __init__(self, servicer: EncoderServicer, config: encoder_pb2.EncodeConfig):
        s = servicer.settings
        self.servicer = servicer
        try:
            check_end_silence(config.end_silence_seconds)
            self.input = SpeechInput(config.sample_rate, config.format,
                                     LISTEN_SECONDS if config.detect_speech else s.max_turn_seconds)
        except InvalidArgument as err:
            raise err.within("config") from None
        self.gate = self.vad = None
        if config.detect_speech:
            self.gate = SpeechGate(s.speech_threshold, config.end_silence_seconds or s.end_silence_seconds,
                                   s.speech_pad_seconds, s.max_turn_seconds)
            self.vad = VadStream()
        self.stream: EncoderStream | None = None if config.detect_speech else self._open()
        self.encoded = 0  # samples given to the encoder
        self.feeds: list = []  # the worker's futures of the samples handed in and not yet encoded
        self.done = False

    def _open(self) -> EncoderStream:
        try:
            return EncoderStream(self.servicer.model, self.servicer.pool)
        except PoolFull:
            raise ResourceExhausted(f"every one of the encoder's {self.servicer.pool.slots} speaker places "
                                    f"is taken", RETRY_AFTER_SECONDS) from None

    def _encode(self, samples: np.ndarray) -> None:
        """Hand samples to the worker without waiting for them: the call reads on, so a speaker's audio that arrives
        while the worker is busy waits there and goes into its next call together (worker.py). Awaiting each chunk
        instead let a speaker have one chunk in flight at a time: at 64 speakers the encoder fell behind
        (docs/benchmarks.md). A failed feed surfaces at the next chunk, or at the end."""
        for done in [f for f in self.feeds if f.done()]:
            self.feeds.remove(done)
            done.result()  # (raises its error)
        if len(samples):
            self.encoded += len(samples)
            self.feeds.append(self.servicer.worker.submit(Job(self.stream, torch.from_numpy(samples))))

    async def audio(self, pcm: bytes) -> list[encoder_pb2.EncodeResponse]:
        """The next chunk → what it made known (speech started, ended)."""
        samples = self.input.push(pcm)
        if self.gate is None:
            self._encode(samples)
            return []
        probabilities = await asyncio.wrap_future(self.servicer.vad.probabilities(self.vad, samples))
        step = self.gate.advance(samples, probabilities)
        events = []
        if step.started is not None:
            metrics.SPEECH.labels("started").inc()
            self.stream = self._open()
            events.append(encoder_pb2.EncodeResponse(started=encoder_pb2.SpeechStarted(audio_seconds=step.started / SAMPLE_RATE)))
        self._encode(step.speech)
        if step.ended is not None:
            metrics.SPEECH.labels("ended").inc()
            events.append(encoder_pb2.EncodeResponse(ended=encoder_pb2.SpeechEnded(audio_seconds=step.ended / SAMPLE_RATE)))
            self.done = True
        return events

    async def end(self) -> encoder_pb2.EncodeResponse:
        """The turn's end (the client's, or the gate's) → its codes."""
        if not self.done:  # the client's end
            tail = self.input.end()
            if self.gate is not None:
                step = self.gate.advance(tail, await asyncio.wrap_future(self.servicer.vad.probabilities(self.vad, tail)))
                if step.started is not None:  # (speech in the resampler's last samples: too short to be a turn)
                    self.stream = self._open()
                tail = np.concatenate([step.speech, self.gate.finish().speech])
            if self.stream is not None:
                self._encode(tail)
        self.done = True
        ended = time.perf_counter()
        codes: list[int] = []
        if self.stream is not None:
            end = self.servicer.worker.submit(Job(self.stream, None))  # (after every feed: the worker keeps order)
            for feed in self.feeds:
                await asyncio.wrap_future(feed)
            codes = await asyncio.wrap_future(end)
            reencoded = self.stream.reencoded
        finish = time.perf_counter() - ended
        metrics.FINISH.observe(finish)
        metrics.AUDIO_SECONDS.inc(self.encoded / SAMPLE_RATE)
        return encoder_pb2.EncodeResponse(turn=encoder_pb2.EncodedTurn(
            codes=codes, audio_seconds=self.encoded / SAMPLE_RATE, finish_seconds=finish,
            speech_detected=self.stream is not None, reencoded_segments=reencoded if self.stream is not None else 0))

    def close(self) -> None:
        """The call is over: a speaker's place it still holds goes back (the worker frees it between calls)."""
        if self.stream is not None and not self.stream.done:
            self.servicer.worker.abort(self.stream)


class EncoderServicer(encoder_pb2_grpc.EncoderServicer):
    def __init__(self, model: WhisperVQEncoder, settings: EncoderSettings, pool: KVPool, vad: VadWorker | None = None):
        """pool: the speakers' places (--max-speakers, or as many as fit), the one the model's graphs are over if it has
        any."""
        self.model, self.settings, self.pool = model, settings, pool
        self.worker = EncoderWorker(settings.speakers_per_call, on_batch=metrics.observe_batch)
        self.vad = vad if vad is not None else VadWorker(on_batch=metrics.observe_vad_batch)
        self.calls = 0
        metrics.watch_speakers(self.pool, self.pool.slots)

    def stop(self) -> None:
        self.worker.stop()
        self.vad.stop()

    async def Encode(self, request_iterator, context):
        open_before = self.calls
        self.calls += 1
        metrics.CALLS.inc()
        turn = None
        try:
            first = await anext(aiter(request_iterator), None)
            try:
                if open_before >= self.settings.max_listeners:
                    raise ResourceExhausted(f"the encoder has {open_before} calls open (--max-listeners)",
                                            RETRY_AFTER_SECONDS)
                if first is None or first.WhichOneof("kind") != "config":
                    raise InvalidArgument("config", "the first message of an Encode call must be a config")
                turn = Turn(self, first.config)
                async for req in request_iterator:
                    kind = req.WhichOneof("kind")
                    if kind == "end":
                        break
                    if kind != "audio":
                        raise InvalidArgument(kind or "kind", "only audio or end may follow the config")
                    for event in await turn.audio(req.audio.pcm):
                        yield event
                    if turn.done:  # the speech ended: the turn is over, whatever else the client sends
                        break
                yield await turn.end()
            except ServiceError as err:  # said first, then the status once the client stops sending (encoder.proto)
                if turn is not None:
                    turn.close()  # (its place goes back now, not after the wait)
                    turn = None
                yield encoder_pb2.EncodeResponse(refused=encoder_pb2.EncodeRefused(
                    code=err.code, message=str(err), retry_after_seconds=getattr(err, "retry_after", None) or 0.0))
                await until_the_client_lets_go(request_iterator)
                raise
        finally:
            if turn is not None:
                turn.close()
            self.calls -= 1
            metrics.CALLS.dec()


async def until_the_client_lets_go(request_iterator) -> None:
    """Read (and drop) what a refused call's client still sends until it half-closes or cancels, REFUSED_SECONDS at
    most: the gateway cancels the call as soon as it reads the refusal."""
    async def drain():
        async for _ in request_iterator:
            pass

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(drain(), REFUSED_SECONDS)
