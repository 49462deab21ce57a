"""One spoken turn through the two stages, pipelined:

    llm.Generate ──token chunks──▶ pump task ──▶ vocoder.Vocode ──PCM chunks──▶ client

The pump forwards each token chunk to the vocoder the moment it arrives, so the vocoder works on chunk
i while the llm makes chunk i+1, and PCM goes back to the client as soon as each piece is ready.
Whatever ends the turn — done, an error in either stage, or the client leaving — both upstream calls
are cancelled and the pump task is awaited, so nothing is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc
from moss.speech.v1 import gateway_pb2, llm_pb2, vocoder_pb2

from services.common.audio import BYTES_PER_SAMPLE
from services.common.errors import DeadlineExceeded, ServiceError, StageError, Unavailable
from services.common.playback import JITTER_SECONDS, PlaybackClock
from services.gateway import metrics
from services.gateway.admission import Place
from services.gateway.backends import Backends, Pool, Replica
from services.gateway.client_writes import ClientWrites
from services.gateway.headroom import Headroom
from services.gateway.session import Session
from services.gateway.turn_request import Spoken, TurnLimits, validate
from services.gateway.voice_owners import SHARED
from services.gateway.voices import resolve_voice

log = logging.getLogger(__name__)

VOCODER_CLOSE_SECONDS = 1.0  # after the last PCM: how long the vocoder may take to end its call
STATUS_SECONDS = 1.0         # after a failed write: how long the call's own status may take to arrive
# A client that has not taken the turn's last audio for this long has stopped reading (a reading client takes each
# message at once: the transport's window holds seconds of audio): the turn stops feeding the vocoder until it does
# (Turn._client_reading). --client-stall-seconds ends the call later (services/common/interceptor.py).
CLIENT_HOLD_SECONDS = 0.5
HOLD_CALL_SECONDS = 2.0  # for the llm to answer a Hold


# gRPC core's own status for an operation on a stream whose connection broke under it (a write racing the peer's
# death): the stage went away, it did not fail the call itself (which would carry its own message). A write that
# crosses the call's deadline gets the same status (1.5-2% of writes made at the deadline on loopback), which is why
# Turn._stage_error asks the turn's clock first.
BROKEN_STREAM = "Internal error from Core"


def stage_error(stage: str, code: grpc.StatusCode, details: str | None) -> ServiceError:
    """A stage's call ended with this status: the error the gateway reports, the stage named."""
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(stage, details or "connection failed")
    if code == grpc.StatusCode.INTERNAL and details == BROKEN_STREAM:
        return Unavailable(stage, "connection lost mid-stream")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"{stage}: deadline exceeded")
    return StageError(stage, code.name, details or code.name)


class Leg:
    """One stage's part of a turn: the replica it runs on (counted there as a call in progress) and its call."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self.replica: Replica | None = None
        self.call = None

    def move(self, replica: Replica | None, open_call: Callable[[Replica], object] | None = None) -> None:
        """Run on `replica` (None: nowhere) with the call `open_call` makes there, leaving the call before."""
        if self.replica is not None:
            self.call.cancel()
            self.replica.add_calls(-1)
        self.replica = replica
        if replica is not None:
            replica.add_calls(1)
            self.call = open_call(replica)


class Turn:
    """State of one turn (a Synthesize call, or a turn of a Converse session); `run()` yields Synthesize's
    messages. session: the Converse session (its replica and history, session.py); on_text(piece) gets the
    text the model emits.

    A replica that fails before it has answered the turn (unreachable: it died, or is restarting) is marked
    down and its part starts again on another (or on the same one once it is back, within --ready-wait):
    the llm's until its first chunk, the vocoder's until its header. Once a stage has answered, a failure
    ends the turn."""

    def __init__(self, req, backends: Backends, limits: TurnLimits, timeout: float | None,
                 session: Session | None = None, on_text: Callable[[str], None] | None = None,
                 spoken: Spoken | None = None, text_reply: bool = False, headroom: Headroom | None = None,
                 place: Place | None = None, client: ClientWrites | None = None, protocol: str = "grpc",
                 owner: str = SHARED):
        """spoken: a spoken turn (its clock starts when the speech ended); text_reply: the reply is text alone;
        headroom: told each chunk's slack and the turn's TTFA (admission by headroom); place: told when the first
        audio is out (the turn's start slot frees; the turn's times count from when it asked for its place:
        shared/DESIGN.md §6, what the caller waited, while the headroom rule reads TTFA from its admission, the
        stages' part); client: whether the client takes what is written to it (a Converse session's; default: the
        turn's own writes); protocol: the door it came through (its metrics' label); owner: whose voices it may
        name besides the shared ones (voice_owners.owner_of)."""
        admitted = time.perf_counter()
        received = place.asked_at if place is not None else admitted
        self.summary = gateway_pb2.SynthesisSummary(admission_wait_seconds=admitted - received)
        self.start = spoken.ended_at if spoken is not None else received
        # the headroom rule's TTFA and the deadline count from here (a spoken turn's: from its speech's end)
        self.admitted_at = spoken.ended_at if spoken is not None else admitted
        self.spoken, self.text_reply = spoken, text_reply
        self.headroom, self.place, self.protocol, self.owner = headroom, place, protocol, owner
        self.req = req
        self.session, self.on_text = session, on_text
        self.backends = backends
        self.limits = limits
        self.deadline = self.admitted_at + (timeout if timeout is not None else limits.default_timeout)
        self.first_tokens_sent: float | None = None
        self.audio_token_chunks: list[float] = []  # when the llm's first two chunks with audio tokens came in
        self.second_sent = False  # the second audio chunk went to the client (SynthesisSummary.second_chunk_*)
        self.ready_waited = 0.0  # seconds the turn waited for a stage that was not ready (starting, restarting)
        self.stalls = 0
        self.turn_tokens: llm_pb2.PromptTokens | None = None  # a session's turn: what it added to the history
        self.gen_req = llm_pb2.GenerateRequest()
        self.llm, self.vocoder = Leg(backends.llm), Leg(backends.vocoder)
        self.voice = ""
        # whether the client takes its audio: a Synthesize turn writes to it itself (and marks it); a Converse turn's
        # messages go through its conversation's outbox, whose writer marks the conversation's
        self.client, self.marks_writes = (client, False) if client is not None else (ClientWrites(), True)

    def _left(self) -> float:
        return self.deadline - time.perf_counter()

    def _stage_error(self, stage: str, code: grpc.StatusCode, details: str | None) -> ServiceError:
        """A stage's call of this turn ended with this status → the error to report. Once the turn's time is up it
        ended on the deadline, whatever status gRPC's core gave it: a write that crossed the deadline gets the bare
        INTERNAL of a broken stream, and read as one it would mark a healthy replica down for every turn to come."""
        if self._left() <= 0:
            return DeadlineExceeded(f"{stage}: deadline exceeded")
        return stage_error(stage, code, details)

    async def run(self):
        self.gen_req, fmt = validate(self.req, self.limits, self.session, self.spoken, self.text_reply)
        if self.spoken is not None:
            self.summary.encoder_finish_seconds = self.spoken.encoder_finish_seconds
            self.summary.user_codes = len(self.spoken.codes)
            self.summary.user_audio_seconds = self.spoken.audio_seconds
        if self.text_reply:
            async for msg in self._run_text():
                yield msg
            return
        # A replica of each stage (the session's llm while it is ready); a stage still starting is waited
        # for, within the deadline.
        llm, vocoder, self.ready_waited = await self.backends.acquire(self._left(), self.session.replica if self.session else None)
        # before any stage works on the turn
        known = await self.backends.voices_of(vocoder, self.req.voice)
        self.voice = resolve_voice(self.req.voice, known, self.backends.voice_owners, self.owner)
        pump = None
        try:
            self._use_llm(llm)  # the prompt is prefilled while the vocoder stream opens
            header = await self._open_vocoder(vocoder, fmt)
            yield gateway_pb2.SynthesizeResponse(metadata=gateway_pb2.StreamMetadata(
                request_id=self.gen_req.request_id, sample_rate=header.sample_rate, format=header.format, channels=1))
            pump = asyncio.create_task(self._pump())
            async for msg in self._pcm(pump, BYTES_PER_SAMPLE[fmt], header.sample_rate):
                yield msg
            await pump  # the llm's final chunk has been forwarded; surfaces any pump error
            yield gateway_pb2.SynthesizeResponse(summary=self._finish(header.sample_rate))
            # The vocoder ends its call when it sees our half-close: let it, rather than cancel a finished
            # stream (its metrics would count a CANCELLED request for every turn).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.vocoder.call.code(), VOCODER_CLOSE_SECONDS)
        except Unavailable as err:  # until its health check says otherwise, that replica gets no more calls
            leg = self.llm if err.stage == "llm" else self.vocoder
            if leg.replica is not None:
                leg.pool.mark_down(leg.replica, err)
            raise
        finally:
            self.llm.move(None)
            self.vocoder.move(None)
            if pump is not None and not pump.done():
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)

    async def _run_text(self):
        """A text reply: the llm alone; its text goes out through on_text, then the summary."""
        try:
            self._use_llm(await self.backends.acquire_llm(self._left(), self.session.replica if self.session else None))
            async with contextlib.aclosing(self._llm_chunks()) as chunks:
                async for chunk in chunks:
                    self._take(chunk)
            yield gateway_pb2.SynthesizeResponse(summary=self._finish(0))
        except Unavailable as err:
            if self.llm.replica is not None and err.stage == "llm":
                self.llm.pool.mark_down(self.llm.replica, err)
            raise
        finally:
            self.llm.move(None)

    def _use_llm(self, replica: Replica) -> None:
        """Generate on `replica` (a session's turn: the session is there now)."""
        if self.session is not None:
            self.session.place(replica)
        self.llm.move(replica, lambda r: r.stub.Generate(self.gen_req, timeout=self._left()))

    async def _open_vocoder(self, replica: Replica, fmt: int) -> vocoder_pb2.VocodeResponse:
        """Open the Vocode stream → its header; a replica that fails first is replaced (see the class)."""
        chunking = self.gen_req.chunking
        config = vocoder_pb2.VocodeConfig(request_id=self.gen_req.request_id, format=fmt, voice=self.voice,
                                          lookahead_frames=chunking.lookahead_frames
                                          if chunking.HasField("lookahead_frames") else None,
                                          playback_speed=chunking.playback_speed
                                          if chunking.HasField("playback_speed") else None)
        for attempt in range(len(self.vocoder.pool.replicas) + 1):
            self.vocoder.move(replica, lambda r: r.stub.Vocode(timeout=self._left()))
            try:
                call = self.vocoder.call
                await self._vocoder_io(call, call.write(vocoder_pb2.VocodeRequest(config=config)))
                header = await self._vocoder_io(call, call.read())
                if header is grpc.aio.EOF:
                    raise Unavailable("vocoder", "stream closed before its header")
                return header
            except Unavailable as err:
                if attempt == len(self.vocoder.pool.replicas):
                    raise
                replica = await self.backends.replace(self.vocoder.pool, replica, self._left(), err)

    async def _vocoder_io(self, call, awaitable):
        """Await a read or write of the Vocode call; a failure becomes the stage's error. A write that crosses
        the end of the call fails with a bare INTERNAL ("Internal error from Core"), or finds it ended: the
        call's own status says why it ended (UNAVAILABLE, for a vocoder that died; at the turn's deadline, the
        deadline: _stage_error)."""
        try:
            return await awaitable
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            try:
                code = await asyncio.wait_for(call.code(), STATUS_SECONDS)
                details = await call.details()
            except TimeoutError:
                code = details = None
            if code in (None, grpc.StatusCode.OK):
                if isinstance(err, grpc.aio.AioRpcError):
                    code, details = err.code(), err.details()
                else:  # ended with no status to tell
                    code, details = grpc.StatusCode.UNAVAILABLE, "stream closed"
            raise self._stage_error("vocoder", code, details) from None

    async def _llm_chunks(self):
        """The llm's chunks. A replica that fails before its first chunk is replaced (see the class): the
        turn, and a session with its history, starts again there."""
        for attempt in range(len(self.llm.pool.replicas) + 1):
            answered = False
            try:
                async for chunk in self.llm.call:
                    answered = True
                    yield chunk
                return
            except grpc.aio.AioRpcError as err:
                error = self._stage_error("llm", err.code(), err.details())
                if answered or not isinstance(error, Unavailable) or attempt == len(self.llm.pool.replicas):
                    raise error from None
            self._use_llm(await self.backends.replace(self.llm.pool, self.llm.replica, self._left(), error))

    async def _pump(self) -> None:
        """llm token chunks → vocoder, as they arrive. On an llm error the vocoder call is cancelled
        (which unblocks the PCM reader) and the error is re-raised for run() to report."""
        voc_call = self.vocoder.call
        try:
            async with contextlib.aclosing(self._llm_chunks()) as chunks:
                async for chunk in chunks:
                    self._take(chunk)
                    if chunk.audio_tokens:
                        await self._client_reading()
                        self.first_tokens_sent = self.first_tokens_sent or time.perf_counter()
                        self.summary.audio_tokens += len(chunk.audio_tokens)
                        await self._vocoder_io(voc_call, voc_call.write(vocoder_pb2.VocodeRequest(
                            tokens=vocoder_pb2.AudioTokens(tokens=chunk.audio_tokens))))
            await self._vocoder_io(voc_call, voc_call.write(vocoder_pb2.VocodeRequest(end=vocoder_pb2.EndOfTokens())))
            await self._vocoder_io(voc_call, voc_call.done_writing())
        except BaseException:
            voc_call.cancel()
            raise

    async def _client_reading(self) -> None:
        """Wait while the client has not taken the last audio for CLIENT_HOLD_SECONDS: its stream is paused at the
        vocoder, which gets nothing more, and at the llm, which steps it no more (Llm.Hold), until the client takes
        it (or its call ends: --client-stall-seconds)."""
        if self.client.waiting_for(CLIENT_HOLD_SECONDS):
            metrics.CLIENT_HOLDS.inc()
            replica = self.llm.replica
            with self.place.held() if self.place is not None else contextlib.nullcontext():
                await self._hold_llm(replica, True)
                await self.client.took.wait()
                await self._hold_llm(replica, False)

    async def _hold_llm(self, replica: Replica | None, held: bool) -> None:
        """Hold (or release) this turn at its llm replica. Best effort: where it fails, the llm goes on at its pace
        (up to 1.5 s of audio ahead of playback on CUDA), as it would without the hold."""
        if replica is None:
            return
        try:
            await replica.stub.Hold(llm_pb2.HoldRequest(request_id=self.gen_req.request_id, held=held),
                                    timeout=HOLD_CALL_SECONDS)
        except grpc.aio.AioRpcError as err:
            log.info("gateway: turn %s: Llm.Hold(%s) failed (%s): the llm goes on", self.gen_req.request_id, held,
                     err.code().name)

    def _take(self, chunk: llm_pb2.GenerateResponse) -> None:
        """What the gateway keeps of an llm chunk: timings, text, and on the final one its stats."""
        if chunk.first:
            self.summary.llm_first_chunk_seconds = time.perf_counter() - self.start
            self.summary.llm_first_chunk_in_llm_seconds = chunk.since_arrival_seconds
            metrics.LLM_FIRST_CHUNK.observe(self.summary.llm_first_chunk_seconds)
        if chunk.audio_tokens and len(self.audio_token_chunks) < 2:  # (the second audio chunk's: after the first's)
            self.audio_token_chunks.append(time.perf_counter())
            if len(self.audio_token_chunks) == 2:
                self.summary.llm_second_chunk_seconds = self.audio_token_chunks[1] - self.audio_token_chunks[0]
        if chunk.text and self.on_text is not None:
            self.on_text(chunk.text)
        if chunk.final:
            if chunk.HasField("turn_tokens"):
                self.turn_tokens = chunk.turn_tokens
            s = chunk.stats
            self.summary.prompt_tokens = s.prompt_tokens
            self.summary.llm_queue_seconds = s.queue_seconds
            self.summary.llm_prefill_seconds = s.prefill_seconds
            self.summary.llm_decode_seconds = s.decode_seconds

    async def _pcm(self, pump: asyncio.Task, bytes_per_sample: int, sample_rate: int):
        # (a listener who plays faster, HTTP's `speed`, hears more samples a second: the clock counts them so)
        clock = PlaybackClock(sample_rate * self.gen_req.chunking.playback_speed)
        voc_call = self.vocoder.call
        while True:
            try:
                msg = await voc_call.read()
            except (grpc.aio.AioRpcError, asyncio.CancelledError) as err:
                if pump.done() and pump.exception() is not None:
                    raise pump.exception() from None  # the llm failed; the vocoder was cancelled for it
                if isinstance(err, asyncio.CancelledError):
                    raise
                raise self._stage_error("vocoder", err.code(), err.details()) from None
            if msg is grpc.aio.EOF:
                if pump.done() and pump.exception() is not None:
                    raise pump.exception()
                raise Unavailable("vocoder", "stream ended before its final message")
            if msg.num_samples:
                now = time.perf_counter()
                if not self.summary.num_samples:
                    self.summary.ttfa_seconds = now - self.start
                    metrics.TTFA.labels(self.protocol).observe(self.summary.ttfa_seconds)
                    if self.place is not None:
                        self.place.started()
                    if self.spoken is not None:
                        self.summary.speech_end_to_first_audio_seconds = self.summary.ttfa_seconds
                        metrics.SPEECH_END_TO_FIRST_AUDIO.observe(self.summary.ttfa_seconds)
                    if self.first_tokens_sent is not None:
                        metrics.VOCODER_FIRST_PCM.observe(now - self.first_tokens_sent)
                if len(msg.pcm) != msg.num_samples * bytes_per_sample:
                    raise StageError("vocoder", "INTERNAL", f"{len(msg.pcm)} PCM bytes for {msg.num_samples} samples")
                self.summary.num_samples += msg.num_samples
                playing = clock.due() is not None  # (a first chunk has no deadline)
                if (late := clock.arrive(now, msg.num_samples)) > JITTER_SECONDS:
                    self.stalls += 1
                    metrics.STALL.labels(self.protocol).observe(late)
                if playing:
                    metrics.SLACK.observe(-late)
                    if not self.second_sent:
                        self.second_sent = True  # the chunk its listener waits for with the first one's audio only
                        self.summary.second_chunk_slack_seconds = -late
                        metrics.SECOND_CHUNK_SLACK.observe(-late)
                if self.headroom is not None:
                    if playing:
                        self.headroom.observe_slack(now, -late)
                    else:
                        # (less a wait for a stage not ready: a restart's outage says nothing of the load)
                        self.headroom.observe_ttfa(now, now - self.admitted_at - self.ready_waited)
                with self.client.writing() if self.marks_writes else contextlib.nullcontext():
                    yield gateway_pb2.SynthesizeResponse(audio=gateway_pb2.AudioChunk(
                        pcm=msg.pcm, sample_offset=msg.sample_offset, num_samples=msg.num_samples))
            if msg.final:
                self.summary.vocoder_compute_seconds = msg.stats.compute_seconds
                self.summary.vocoder_first_chunk_seconds = msg.stats.first_chunk_compute_seconds
                self.summary.vocoder_first_chunk_in_vocoder_seconds = msg.stats.first_chunk_seconds
                self.summary.vocoder_first_chunk_queue_seconds = msg.stats.first_chunk_queue_seconds
                self.summary.vocoder_second_chunk_in_vocoder_seconds = msg.stats.second_chunk_seconds
                self.summary.vocoder_second_chunk_queue_seconds = msg.stats.second_chunk_queue_seconds
                return

    def _finish(self, sample_rate: int) -> gateway_pb2.SynthesisSummary:
        s = self.summary
        s.total_seconds = time.perf_counter() - self.start
        s.audio_seconds = s.num_samples / sample_rate if sample_rate else 0.0
        s.real_time_factor = s.total_seconds / s.audio_seconds if s.audio_seconds else 0.0
        metrics.REQUEST.labels(self.protocol).observe(s.total_seconds)
        if s.audio_seconds:
            metrics.RTF.observe(s.real_time_factor)
            metrics.AUDIO_TURNS.labels(self.protocol).inc()
            if self.stalls:
                metrics.STALLED_TURNS.labels(self.protocol).inc()
        return s
