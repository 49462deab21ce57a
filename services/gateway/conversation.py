"""One Converse call: a session of spoken turns, with barge-in.

    client ──config, turns, cancel, close──▶ reader task ──starts / cancels──▶ turn task (a Turn, pipeline.py)
           ──speech, audio, end of speech──▶   listener (listener.py) ──starts / cancels──▶ turn task
    client ◀──────────────── outbox (one queue, in order) ◀──────────────── every task's messages

A turn is typed (UserTurn) or spoken: the listener streams the user's audio to the encoder as it arrives, and its
codes become a turn when the speech ends. With speech detection, speech that starts while a turn runs cancels it,
as a CancelTurn does (barge-in by voice). Bad audio fails that spoken turn (TurnFailed), and the session goes on.

Each turn is a Turn of its own, run as a task, with the session (session.py): the gateway keeps the session's
history and sends it with every turn (the llm keeps none; the replica that ran the last turn has its KV blocks
pinned for the next). One turn runs at a time. A cancel (or a new turn while one runs) cancels the turn's task:
Turn.run's cleanup cancels its llm and vocoder calls (the llm frees the turn's blocks), the history stays as it
was before the turn, and messages of that turn still in the outbox are dropped, so no audio of it reaches the
client after its TurnCancelled. A turn that fails (no place, a stage down) is answered with TurnFailed and the
session goes on, its history as before the turn.

Whatever ends the call (close, half-close, idle timeout, an error, the client leaving), every task is
cancelled and awaited and the llm replica releases the session's pinned blocks, so nothing outlives it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from moss.speech.v1 import gateway_pb2

from services.common.audio import resolve_format
from services.common.errors import Cancelled, DeadlineExceeded, InvalidArgument, ServiceError
from services.common.sampling import resolve_chunking, resolve_sampling
from services.gateway import metrics
from services.gateway.admission import Admission
from services.gateway.backends import Backends
from services.gateway.client_writes import ClientWrites
from services.gateway.listener import Callbacks, Listener
from services.gateway.pipeline import Turn
from services.gateway.session import Session
from services.gateway.turn_request import Spoken, TurnLimits, check_size, validate_text
from services.gateway.voice_owners import owner_of
from services.gateway.voices import resolve_voice

log = logging.getLogger(__name__)

_END = object()  # in the outbox: the call is over (a SessionEnded was just sent)
# Errors that end the call with their status; any other error of a turn is that turn's (TurnFailed).
CALL_ERRORS = (InvalidArgument, DeadlineExceeded, Cancelled)

Reason = gateway_pb2.SessionEndReason


def check_config(config: gateway_pb2.SessionConfig, limits: TurnLimits, voices: tuple[str, ...] | None = None) -> None:
    """Refuse a bad session config before anything runs, its fields named as the client sent them. voices: those
    the ready vocoders have (None: not known yet; each turn's is checked again where it goes)."""
    try:
        resolve_voice(config.voice, voices)
        resolve_format(config.format, "format")
        resolve_sampling(config.sampling if config.HasField("sampling") else None, limits.max_new_tokens)
        resolve_chunking(config.chunking if config.HasField("chunking") else None)
    except InvalidArgument as err:
        raise err.within("config") from None
    if len(config.system_prompt) > limits.max_text_chars:
        raise InvalidArgument("config.system_prompt", f"{len(config.system_prompt)} characters is over the limit "
                                                      f"of {limits.max_text_chars}")


class Conversation:
    def __init__(self, backends: Backends, limits: TurnLimits, admission: Admission, idle_seconds: float, client: str | None,
                 time_left: Callable[[], float | None], protocol: str = "grpc"):
        """client: who calls (admission.client_id: its turns count against --max-turns-per-client); time_left():
        seconds to the call's deadline (None: none); protocol: the door (grpc, websocket), its turns' metrics label."""
        self.backends, self.limits, self.admission = backends, limits, admission
        self.idle_seconds, self.client, self.time_left, self.protocol = idle_seconds, client, time_left, protocol
        self.session = Session(uuid.uuid4().hex)
        self.config = gateway_pb2.SessionConfig()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.writes = ClientWrites()  # whether the client takes what the outbox sends it
        self.turn_no = 0
        self.turn: asyncio.Task | None = None
        self.answered: set[int] = set()        # turns whose summary is out: nothing left to cancel
        self.tails: set[asyncio.Task] = set()  # answered turns' tasks, still closing their vocoder call
        self.cancelled: set[int] = set()  # turns whose remaining messages are dropped
        self.last_activity = time.monotonic()
        self.listener: Listener | None = None  # the user's speech, since their last SpeechInput
        self.speech = gateway_pb2.SpeechInput()
        self.refused_audio = False  # audio with no speech open was answered (once until the next SpeechInput)

    async def run(self, requests) -> AsyncIterator[gateway_pb2.ConverseResponse]:
        requests = aiter(requests)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("kind") != "config":
            raise InvalidArgument("config", "the first message of a Converse call must be a config")
        check_size(first, self.limits, "config")
        check_config(first.config, self.limits, self.backends.voices(owner_of(self.client)))
        self.config = first.config
        self.session.system_prompt = first.config.system_prompt
        metrics.SESSIONS.inc()
        reason = Reason.SESSION_END_REASON_UNSPECIFIED
        tasks = [asyncio.create_task(self._read(requests)), asyncio.create_task(self._watch_idle())]
        try:
            yield gateway_pb2.ConverseResponse(session=gateway_pb2.SessionStarted(session_id=self.session.session_id))
            while (msg := await self.outbox.get()) is not _END:
                if isinstance(msg, BaseException):
                    raise msg
                kind = msg.WhichOneof("kind")
                if msg.turn in self.cancelled and kind != "cancelled":
                    continue  # a cancelled turn's leftovers
                if kind == "ended":
                    reason = msg.ended.reason
                with self.writes.writing():  # a turn whose audio waits here too long stops (pipeline.py)
                    yield msg
        finally:
            # Bookkeeping first, with no await before it: the call's task may be cancelled again while it
            # waits below (the client gone), and that must not skip it.
            metrics.SESSIONS.dec()
            ended = Reason.Name(reason).removeprefix("SESSION_END_REASON_").lower()
            metrics.SESSIONS_ENDED.labels("aborted" if ended == "unspecified" else ended).inc()
            running = [t for t in [*tasks, self.turn, *self.tails] if t is not None]
            for task in running:
                task.cancel()  # a turn's own cleanup cancels its llm and vocoder calls
            if self.listener is not None:  # its encoder calls cancelled: the encoder gives their places back
                running += self.listener.cancel()
            self.session.close()  # its llm replica releases its pinned blocks (a turn running there pins none)
            await asyncio.gather(*running, return_exceptions=True)

    # ---- the client's messages -------------------------------------------------------------------
    async def _read(self, requests) -> None:
        try:
            async for req in requests:
                self.last_activity = time.monotonic()
                kind = req.WhichOneof("kind")
                size = req.ByteSize()  # (once a message: audio comes ten times a second a speaker)
                if kind == "audio" and size > self.limits.max_message_bytes:
                    await self._oversized_audio(size)
                    continue
                check_size(req, self.limits, kind or "request", size)
                if kind == "turn":
                    self._check_turn(req.turn)
                    await self._cancel_turn()
                    self._start_turn(req.turn.text, req.turn.sampling if req.turn.HasField("sampling") else None,
                                     req.turn.reply)
                elif kind == "speech":
                    await self._listen(req.speech)
                elif kind == "audio":
                    if self._listening("audio"):
                        await self.listener.audio(req.audio.pcm)
                elif kind == "end_of_speech":
                    if self._listening("end_of_speech"):
                        await self.listener.end()
                elif kind == "cancel":
                    await self._cancel_turn()
                elif kind == "close":
                    await self._cancel_turn()
                    self._end(Reason.SESSION_END_REASON_CLOSED)
                    return
                elif kind == "config":
                    raise InvalidArgument("config", "only the first message may be a config")
                else:
                    raise InvalidArgument("kind", "set config, turn, speech, audio, end_of_speech, cancel or close")
            if self.turn is not None:  # half-closed: the turn running finishes first
                await asyncio.gather(self.turn, return_exceptions=True)
            self._end(Reason.SESSION_END_REASON_CLIENT_DONE)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001  bad input or a broken call: ends the call with its status
            self.outbox.put_nowait(exc)

    async def _watch_idle(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.idle_seconds / 10))
            idle = self.turn is None or self.turn.done()
            if idle and time.monotonic() - self.last_activity >= self.idle_seconds:
                self._end(Reason.SESSION_END_REASON_IDLE)
                return

    def _end(self, reason: int) -> None:
        self.outbox.put_nowait(gateway_pb2.ConverseResponse(ended=gateway_pb2.SessionEnded(reason=reason)))
        self.outbox.put_nowait(_END)

    # ---- turns -----------------------------------------------------------------------------------
    def _check_turn(self, turn: gateway_pb2.UserTurn) -> None:
        validate_text(turn.text, self.limits, "turn.text")
        if turn.reply not in gateway_pb2.ReplyModality.values():
            raise InvalidArgument("turn.reply", f"unknown value {turn.reply}")
        if turn.HasField("sampling"):
            try:
                resolve_sampling(turn.sampling, self.limits.max_new_tokens)
            except InvalidArgument as err:
                raise err.within("turn") from None

    def _start_turn(self, text: str, sampling, reply: int, spoken: Spoken | None = None) -> None:
        self.turn_no += 1
        c = self.config
        sampling = sampling if sampling is not None else c.sampling if c.HasField("sampling") else None
        req = gateway_pb2.SynthesizeRequest(text=text, voice=c.voice, format=c.format, sampling=sampling,
                                            chunking=c.chunking if c.HasField("chunking") else None)
        text_reply = reply == gateway_pb2.REPLY_MODALITY_TEXT
        self.turn = asyncio.create_task(self._run_turn(self.turn_no, req, spoken, text_reply))

    # ---- spoken turns ----------------------------------------------------------------------------
    async def _listen(self, speech: gateway_pb2.SpeechInput) -> None:
        """A SpeechInput: the audio that follows is the user's next speech (a listener before it is closed)."""
        if speech.HasField("sampling"):
            try:
                resolve_sampling(speech.sampling, self.limits.max_new_tokens)
            except InvalidArgument as err:
                raise err.within("speech") from None
        if speech.reply not in gateway_pb2.ReplyModality.values():
            raise InvalidArgument("speech.reply", f"unknown value {speech.reply}")
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        self.speech, self.refused_audio = speech, False
        try:
            self.listener = Listener(self.backends, speech, self.time_left,
                                     Callbacks(self._speech_started, self._spoken, self._speech_failed))
        except InvalidArgument as err:  # a rate or format no encoder takes: this speech fails, its audio is dropped
            self.refused_audio = True
            self._fail_speech(err)

    async def _oversized_audio(self, size: int) -> None:
        """A UserAudio message over --max-message-bytes: the speech it belongs to fails (its audio is not all there),
        once, and the session goes on; the client sends SpeechInput to speak again."""
        if self.refused_audio:
            return  # (its speech failed already: dropped, as any audio after that failure)
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        self.refused_audio = True
        self._fail_speech(InvalidArgument("audio.pcm", f"a message of {size} bytes is over the limit of "
                                                       f"{self.limits.max_message_bytes} (--max-message-bytes): "
                                                       "send the audio in smaller messages"))

    def _listening(self, field: str) -> bool:
        """Whether audio (or its end) now goes to the listener. Audio with no speech open (none yet, or after
        EndOfSpeech) fails the spoken turn that would have been, once, and the session goes on; after a failure
        already reported, the client's audio still in flight is dropped."""
        if self.listener is not None and not self.listener.done:
            return True
        if self.listener is None or self.listener.ended:
            if not self.refused_audio:
                self.refused_audio = True
                problem = ("the speech has ended (EndOfSpeech)" if self.listener is not None else "no speech is open") \
                    + "; send speech (a SpeechInput) first"
                self._fail_speech(InvalidArgument(field, problem))
        return False

    async def _speech_started(self, audio_seconds: float) -> None:
        if self.turn is not None and not self.turn.done() and self.turn_no not in self.answered:
            metrics.VOICE_BARGE_INS.inc()
        await self._cancel_turn()  # barge-in by voice: as a CancelTurn
        self.outbox.put_nowait(gateway_pb2.ConverseResponse(
            turn=self.turn_no + 1, speech_started=gateway_pb2.UserSpeechStarted(audio_seconds=audio_seconds)))

    async def _spoken(self, spoken: Spoken) -> None:
        self.last_activity = time.monotonic()
        metrics.SPOKEN_TURNS.inc()
        await self._cancel_turn()
        self.outbox.put_nowait(gateway_pb2.ConverseResponse(turn=self.turn_no + 1, speech_ended=gateway_pb2.UserSpeechEnded(
            audio_seconds=spoken.audio_seconds, codes=len(spoken.codes))))
        s = self.speech
        self._start_turn("", s.sampling if s.HasField("sampling") else None, s.reply, spoken)

    async def _speech_failed(self, err: ServiceError) -> None:
        self._fail_speech(err)

    def _fail_speech(self, err: ServiceError) -> None:
        """A spoken turn failed before it ran: it takes its number, as a typed turn that fails does."""
        metrics.TURN_FAILURES.labels(err.code).inc()
        self.turn_no += 1
        self.outbox.put_nowait(gateway_pb2.ConverseResponse(turn=self.turn_no, failed=gateway_pb2.TurnFailed(
            code=err.code, message=str(err), retry_after_seconds=getattr(err, "retry_after", None) or 0.0)))

    async def _run_turn(self, n: int, req: gateway_pb2.SynthesizeRequest, spoken: Spoken | None = None,
                        text_reply: bool = False) -> None:
        put = self.outbox.put_nowait
        try:
            # a session answered before goes ahead of new ones (admission.py)
            async with self.admission.turn(self.time_left(), self.client, ongoing=bool(self.answered)) as place:
                metrics.ACTIVE.inc()
                try:
                    turn = Turn(req, self.backends, self.limits, self.time_left(), self.session,
                                on_text=lambda piece: put(gateway_pb2.ConverseResponse(turn=n, text=gateway_pb2.TextPiece(text=piece))),
                                spoken=spoken, text_reply=text_reply, headroom=self.admission.headroom,
                                place=place, client=self.writes, protocol=self.protocol, owner=owner_of(self.client))
                    async for msg in turn.run():
                        kind = msg.WhichOneof("kind")
                        if kind == "summary":  # the turn is the client's now: it joins the history
                            self.session.remember(turn.turn_tokens)
                            self.answered.add(n)
                        put(gateway_pb2.ConverseResponse(turn=n, **{kind: getattr(msg, kind)}))
                finally:
                    metrics.ACTIVE.dec()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001
            if n in self.cancelled:  # it was being cancelled: its calls' errors are the cancel's echo
                return
            if isinstance(exc, ServiceError) and not isinstance(exc, CALL_ERRORS):  # the turn fails, the session goes on
                metrics.TURN_FAILURES.labels(exc.code).inc()
                put(gateway_pb2.ConverseResponse(turn=n, failed=gateway_pb2.TurnFailed(
                    code=exc.code, message=str(exc), retry_after_seconds=getattr(exc, "retry_after", None) or 0.0)))
            else:  # bad input, the call's deadline, a bug: the call ends with its status
                put(exc)
        finally:
            self.last_activity = time.monotonic()

    async def _cancel_turn(self) -> None:
        """Stop the turn running, if any: its calls are cancelled and awaited before TurnCancelled is sent."""
        if self.turn is None or self.turn.done():
            return
        if self.turn_no in self.answered:  # finished: let its tail end on its own
            self.tails.add(self.turn)
            self.turn.add_done_callback(self.tails.discard)
            self.turn = None
            return
        started = time.perf_counter()
        self.cancelled.add(self.turn_no)
        self.turn.cancel()
        await asyncio.gather(self.turn, return_exceptions=True)
        seconds = time.perf_counter() - started
        metrics.CANCELS.inc()
        metrics.CANCEL.observe(seconds)
        self.outbox.put_nowait(gateway_pb2.ConverseResponse(turn=self.turn_no, cancelled=gateway_pb2.TurnCancelled(seconds=seconds)))
