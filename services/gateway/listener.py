"""The user's speech in a Converse session: its audio to the encoder as it arrives, its codes back as a turn.

    client ──SpeechInput, UserAudio..., EndOfSpeech──▶ Listener ──one Encode call per utterance──▶ encoder
    conversation ◀── speech started / speech ended + codes / failed ──┘

The audio is written to the encoder as it comes, so the encoder works while the user speaks and the codes are ready
moments after the speech ends. Without detection, the audio up to EndOfSpeech is one utterance, and the listener is
done. With detection (hands-free), the encoder finds the speech, says where it starts (the conversation cancels a
reply that is running: barge-in) and ends its call when the speech ends; the next audio opens the next call, until
EndOfSpeech. A failed call (bad audio, the encoder down) ends the listener: the conversation answers TurnFailed, and
the client sends SpeechInput again to speak again.

When the speech ended is the turn's clock: EndOfSpeech's arrival, or the encoder's SpeechEnded's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from moss.speech.v1 import encoder_pb2, gateway_pb2

from services.common.audio import BYTES_PER_SAMPLE, resolve_format
from services.common.errors import InvalidArgument, ResourceExhausted, ServiceError, StageError
from services.encoder.speech_input import check_end_silence, check_rate
from services.gateway.backends import Backends, Replica
from services.gateway.pipeline import BROKEN_STREAM, STATUS_SECONDS, stage_error
from services.gateway.turn_request import Spoken

FIELDS = {"config.": "speech."}  # the encoder's field names → the client's (SpeechInput is the Encode call's config)
NO_SPEECH = InvalidArgument("audio", "no speech was heard before EndOfSpeech (speech.detect_speech)")


@dataclass(eq=False)
class Utterance:
    call: object                    # its Encode call
    offset: float                   # seconds of the audio sent before it
    ended_at: float | None = None   # time.perf_counter() when its speech ended


@dataclass
class Callbacks:
    started: Callable[[float], Awaitable[None]]    # speech started, at this many seconds of the audio
    spoken: Callable[[Spoken], Awaitable[None]]    # an utterance's codes: a turn
    failed: Callable[[ServiceError], Awaitable[None]]


def client_error(err: ServiceError) -> ServiceError:
    """An encoder error as the client sent the fields (speech.sample_rate, not config.sample_rate)."""
    if isinstance(err, ServiceError) and err.code == "INVALID_ARGUMENT":
        message = str(err).removeprefix("encoder: ")
        for theirs, ours in FIELDS.items():
            message = message.replace(theirs, ours, 1) if message.startswith(theirs) else message
        field, _, problem = message.partition(": ")
        return InvalidArgument(field, problem)
    return err


def refusal(refused: encoder_pb2.EncodeRefused) -> ServiceError:
    """The encoder's refusal as the error its status would have been."""
    if refused.code == "RESOURCE_EXHAUSTED":
        return ResourceExhausted(f"encoder: {refused.message}", refused.retry_after_seconds or None)
    return StageError("encoder", refused.code, refused.message)


async def final_status(call, err: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    """Why the call ended. A read that races the encoder's end may fail with gRPC core's bare INTERNAL; the call's
    own status then may say what the encoder said. (A refusal comes as a message first: EncodeRefused.)"""
    if err.code() == grpc.StatusCode.INTERNAL and err.details() == BROKEN_STREAM:
        with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError):
            code = await asyncio.wait_for(call.code(), STATUS_SECONDS)
            if code not in (grpc.StatusCode.OK, grpc.StatusCode.INTERNAL):
                return code, await call.details()
    return err.code(), err.details()


class Listener:
    def __init__(self, backends: Backends, speech: gateway_pb2.SpeechInput, time_left: Callable[[], float | None],
                 callbacks: Callbacks):
        """time_left: the Converse call's deadline, in seconds from now (None: none; an Encode call then lives as
        long as its utterance, or the session)."""
        try:  # (as the encoder checks them: refused here, before any audio goes anywhere)
            check_rate(speech.sample_rate)
            check_end_silence(speech.end_silence_seconds)
            fmt = resolve_format(speech.format, "format")
        except InvalidArgument as err:
            raise err.within("speech") from None
        self.backends, self.speech, self.time_left, self.callbacks = backends, speech, time_left, callbacks
        self.bytes_per_second = BYTES_PER_SAMPLE[fmt] * max(speech.sample_rate, 1)
        self.config = encoder_pb2.EncodeConfig(sample_rate=speech.sample_rate, format=fmt,
                                               detect_speech=speech.detect_speech,
                                               end_silence_seconds=speech.end_silence_seconds)
        self.utterance: Utterance | None = None  # the one audio goes to (None: the next audio opens one)
        self.sent_bytes = 0
        self.readers: set[asyncio.Task] = set()
        self.done = False                 # ended (EndOfSpeech, or a failure): audio is no longer taken
        self.ended = False                # by EndOfSpeech
        self.heard = False                # with detection: the encoder found speech since SpeechInput

    async def audio(self, pcm: bytes) -> None:
        if self.done:
            return
        if self.utterance is None and not await self._opened():
            return
        self.sent_bytes += len(pcm)
        await self._write(self.utterance, encoder_pb2.EncodeRequest(audio=encoder_pb2.AudioData(pcm=pcm)))

    async def end(self) -> None:
        """EndOfSpeech: the utterance in progress is the turn (none in progress, with detection: nothing more, or,
        if no speech was heard since SpeechInput, a failed turn saying so)."""
        if self.done:
            return
        self.done = self.ended = True
        if self.utterance is None:
            if self.speech.detect_speech:
                if not self.heard:
                    await self.callbacks.failed(NO_SPEECH)
                return
            if not await self._opened():
                return  # (no audio at all, without detection: the encoder says so, as for any turn)
        utterance, self.utterance = self.utterance, None
        utterance.ended_at = time.perf_counter()
        await self._write(utterance, encoder_pb2.EncodeRequest(end=encoder_pb2.EndOfTurn()))
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await utterance.call.done_writing()

    def cancel(self) -> list[asyncio.Task]:
        """Cancel its calls now, without a wait (a session's cleanup may itself be cancelled at its first await) →
        their readers, to await: each reader's cleanup cancels its call, whether awaited or not."""
        self.done = True
        readers = list(self.readers)
        for task in readers:
            task.cancel()
        return readers

    async def close(self) -> None:
        """Nothing of the listener outlives this: its calls are cancelled and their readers awaited."""
        await asyncio.gather(*self.cancel(), return_exceptions=True)

    async def _opened(self) -> bool:
        """Open the next utterance's call → whether it opened (no encoder ready: the speech fails)."""
        try:
            await self._open()
            return True
        except ServiceError as err:
            self.done = True
            await self.callbacks.failed(err)
            return False

    async def _open(self) -> None:
        left = self.time_left()
        replica = await self.backends.acquire_encoder(self.backends.ready_wait if left is None else left)
        utterance = Utterance(replica.stub.Encode(timeout=left), self.sent_bytes / self.bytes_per_second)
        self.utterance = utterance
        replica.add_calls(1)
        task = asyncio.create_task(self._read(utterance, replica))
        self.readers.add(task)
        task.add_done_callback(self.readers.discard)
        # (a done callback, not the reader's own `finally`: it runs for a reader cancelled before it ever ran, too)
        task.add_done_callback(lambda _: (utterance.call.cancel(), replica.add_calls(-1)))
        await self._write(utterance, encoder_pb2.EncodeRequest(config=self.config))

    @staticmethod
    async def _write(utterance: Utterance, message) -> None:
        """A write that fails finds the call ended: its reader reports why (or, after the speech ended, nothing
        is lost: the encoder reads no more of it)."""
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await utterance.call.write(message)

    async def _read(self, utterance: Utterance, replica: Replica) -> None:
        call = utterance.call
        try:
            async for reply in call:
                kind = reply.WhichOneof("kind")
                if kind == "started":
                    self.heard = True
                    await self.callbacks.started(utterance.offset + reply.started.audio_seconds)
                elif kind == "ended":
                    utterance.ended_at = time.perf_counter()
                    if self.utterance is utterance:
                        self.utterance = None  # hands-free: the next audio is the next utterance's
                elif kind == "turn" and reply.turn.codes:
                    turn = reply.turn
                    await self.callbacks.spoken(Spoken(list(turn.codes), utterance.ended_at or time.perf_counter(),
                                                       turn.finish_seconds, turn.audio_seconds))
                elif kind == "turn" and not self.heard:  # EndOfSpeech with detection, the audio silence throughout
                    await self.callbacks.failed(NO_SPEECH)
                elif kind == "refused":  # bad audio, no place: said before the call ends (encoder.proto)
                    self.done, self.utterance = True, None
                    await self.callbacks.failed(client_error(refusal(reply.refused)))
                    return
        except grpc.aio.AioRpcError as err:
            code, details = await final_status(call, err)
            if code != grpc.StatusCode.CANCELLED:
                if code == grpc.StatusCode.UNAVAILABLE and self.backends.encoder is not None:
                    self.backends.encoder.mark_down(replica, stage_error("encoder", code, details))
                self.done, self.utterance = True, None
                await self.callbacks.failed(client_error(stage_error("encoder", code, details)))
