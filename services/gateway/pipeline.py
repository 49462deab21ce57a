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
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from moss.speech.v1 import common_pb2, gateway_pb2, llm_pb2, vocoder_pb2

from services.common.audio import BYTES_PER_SAMPLE, resolve_format
from services.common.errors import DeadlineExceeded, InvalidArgument, ServiceError, StageError, Unavailable
from services.common.playback import JITTER_SECONDS, PlaybackClock
from services.common.sampling import resolve_chunking, resolve_sampling, sampling_to_fields
from services.gateway import metrics
from services.gateway.backends import Backends
from services.gateway.voices import resolve_voice


VOCODER_CLOSE_SECONDS = 1.0  # after the last PCM: how long the vocoder may take to end its call


@dataclass(frozen=True)
class TurnLimits:
    max_text_chars: int = 2000
    max_new_tokens: int = 2048
    default_timeout: float = 120.0  # seconds, when the client sets no deadline


def stage_error(stage: str, err: grpc.aio.AioRpcError) -> ServiceError:
    code = err.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(stage, err.details() or "connection failed")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"{stage}: deadline exceeded")
    return StageError(stage, code.name, err.details() or code.name)


def validate_text(text: str, limits: TurnLimits, field: str = "text") -> None:
    if not text.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(text) > limits.max_text_chars:
        raise InvalidArgument(field, f"{len(text)} characters is over the limit of {limits.max_text_chars}")


def validate(req: gateway_pb2.SynthesizeRequest, limits: TurnLimits, session_id: str = "",
             system_prompt: str = "") -> tuple[llm_pb2.GenerateRequest, int]:
    """Everything a client can get wrong is refused here, before any stage is called.
    session_id: the turn continues that llm session; system_prompt: replaces the voice's.
    → (the llm request, the resolved audio format)."""
    validate_text(req.text, limits)
    voice = resolve_voice(req.voice)
    fmt = resolve_format(req.format, "format")
    sampling = resolve_sampling(req.sampling if req.HasField("sampling") else None, limits.max_new_tokens)
    chunking = resolve_chunking(req.chunking if req.HasField("chunking") else None)
    return llm_pb2.GenerateRequest(
        request_id=uuid.uuid4().hex,
        session_id=session_id,
        text=req.text,
        system_prompt=system_prompt or voice.system_prompt,
        sampling=common_pb2.SamplingParams(**sampling_to_fields(sampling)),
        chunking=common_pb2.ChunkPolicy(first_chunk_tokens=chunking.first_chunk_tokens, chunk_tokens=chunking.chunk_tokens,
                                        lookahead_frames=chunking.lookahead_frames),
        output_mode=llm_pb2.OUTPUT_MODE_AUDIO,
    ), fmt


class Turn:
    """State of one turn (a Synthesize call, or a turn of a Converse session); `run()` yields Synthesize's
    messages. session_id / system_prompt: see validate(); on_text(piece) gets the text the model emits."""

    def __init__(self, req, backends: Backends, limits: TurnLimits, timeout: float | None, session_id: str = "",
                 system_prompt: str = "", on_text: Callable[[str], None] | None = None):
        self.start = time.perf_counter()
        self.req = req
        self.session_id, self.system_prompt, self.on_text = session_id, system_prompt, on_text
        self.backends = backends
        self.llm, self.vocoder = backends.llm.stub, backends.vocoder.stub
        self.limits = limits
        self.timeout = timeout if timeout is not None else limits.default_timeout
        self.summary = gateway_pb2.SynthesisSummary()
        self.first_tokens_sent: float | None = None
        self.stalls = 0

    async def run(self):
        gen_req, fmt = validate(self.req, self.limits, self.session_id, self.system_prompt)
        waited = await self.backends.wait_ready(self.timeout)  # a stage still starting: wait, within the deadline
        timeout = self.timeout - waited
        llm_call = self.llm.Generate(gen_req, timeout=timeout)
        voc_call = self.vocoder.Vocode(timeout=timeout)
        pump = None
        try:
            header = await self._vocoder_io(voc_call.write(vocoder_pb2.VocodeRequest(
                config=vocoder_pb2.VocodeConfig(request_id=gen_req.request_id, format=fmt,
                                                lookahead_frames=gen_req.chunking.lookahead_frames
                                                if gen_req.chunking.HasField("lookahead_frames") else None))))
            header = await self._vocoder_io(voc_call.read())
            if header is grpc.aio.EOF:
                raise Unavailable("vocoder", "stream closed before its header")
            yield gateway_pb2.SynthesizeResponse(metadata=gateway_pb2.StreamMetadata(
                request_id=gen_req.request_id, sample_rate=header.sample_rate, format=header.format, channels=1))
            pump = asyncio.create_task(self._pump(llm_call, voc_call))
            async for msg in self._pcm(voc_call, pump, BYTES_PER_SAMPLE[fmt], header.sample_rate):
                yield msg
            await pump  # the llm's final chunk has been forwarded; surfaces any pump error
            yield gateway_pb2.SynthesizeResponse(summary=self._finish(header.sample_rate))
            # The vocoder ends its call when it sees our half-close: let it, rather than cancel a finished
            # stream (its metrics would count a CANCELLED request for every turn).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(voc_call.code(), VOCODER_CLOSE_SECONDS)
        except Unavailable as err:  # until its health check says otherwise, the next turns wait for that stage
            self.backends.mark_down(err.stage)
            raise
        finally:
            llm_call.cancel()
            voc_call.cancel()
            if pump is not None and not pump.done():
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)

    async def _vocoder_io(self, awaitable):
        try:
            return await awaitable
        except grpc.aio.AioRpcError as err:
            raise stage_error("vocoder", err) from None
        except asyncio.InvalidStateError:  # write after the call already ended
            raise Unavailable("vocoder", "stream closed") from None

    async def _pump(self, llm_call, voc_call) -> None:
        """llm token chunks → vocoder, as they arrive. On an llm error the vocoder call is cancelled
        (which unblocks the PCM reader) and the error is re-raised for run() to report."""
        try:
            async for chunk in llm_call:
                if chunk.first:
                    self.summary.llm_first_chunk_seconds = time.perf_counter() - self.start
                    metrics.LLM_FIRST_CHUNK.observe(self.summary.llm_first_chunk_seconds)
                if chunk.text and self.on_text is not None:
                    self.on_text(chunk.text)
                if chunk.audio_tokens:
                    self.first_tokens_sent = self.first_tokens_sent or time.perf_counter()
                    self.summary.audio_tokens += len(chunk.audio_tokens)
                    await self._vocoder_io(voc_call.write(vocoder_pb2.VocodeRequest(
                        tokens=vocoder_pb2.AudioTokens(tokens=chunk.audio_tokens))))
                if chunk.final:
                    s = chunk.stats
                    self.summary.prompt_tokens = s.prompt_tokens
                    self.summary.llm_queue_seconds = s.queue_seconds
                    self.summary.llm_prefill_seconds = s.prefill_seconds
                    self.summary.llm_decode_seconds = s.decode_seconds
            await self._vocoder_io(voc_call.write(vocoder_pb2.VocodeRequest(end=vocoder_pb2.EndOfTokens())))
            await self._vocoder_io(voc_call.done_writing())
        except grpc.aio.AioRpcError as err:
            voc_call.cancel()
            raise stage_error("llm", err) from None
        except BaseException:
            voc_call.cancel()
            raise

    async def _pcm(self, voc_call, pump: asyncio.Task, bytes_per_sample: int, sample_rate: int):
        clock = PlaybackClock(sample_rate)
        while True:
            try:
                msg = await voc_call.read()
            except (grpc.aio.AioRpcError, asyncio.CancelledError) as err:
                if pump.done() and pump.exception() is not None:
                    raise pump.exception() from None  # the llm failed; the vocoder was cancelled for it
                if isinstance(err, asyncio.CancelledError):
                    raise
                raise stage_error("vocoder", err) from None
            if msg is grpc.aio.EOF:
                if pump.done() and pump.exception() is not None:
                    raise pump.exception()
                raise Unavailable("vocoder", "stream ended before its final message")
            if msg.num_samples:
                now = time.perf_counter()
                if not self.summary.num_samples:
                    self.summary.ttfa_seconds = now - self.start
                    metrics.TTFA.observe(self.summary.ttfa_seconds)
                    if self.first_tokens_sent is not None:
                        metrics.VOCODER_FIRST_PCM.observe(now - self.first_tokens_sent)
                if len(msg.pcm) != msg.num_samples * bytes_per_sample:
                    raise StageError("vocoder", "INTERNAL", f"{len(msg.pcm)} PCM bytes for {msg.num_samples} samples")
                self.summary.num_samples += msg.num_samples
                if (late := clock.arrive(now, msg.num_samples)) > JITTER_SECONDS:
                    self.stalls += 1
                    metrics.STALL.observe(late)
                yield gateway_pb2.SynthesizeResponse(audio=gateway_pb2.AudioChunk(
                    pcm=msg.pcm, sample_offset=msg.sample_offset, num_samples=msg.num_samples))
            if msg.final:
                self.summary.vocoder_compute_seconds = msg.stats.compute_seconds
                self.summary.vocoder_first_chunk_seconds = msg.stats.first_chunk_compute_seconds
                return

    def _finish(self, sample_rate: int) -> gateway_pb2.SynthesisSummary:
        s = self.summary
        s.total_seconds = time.perf_counter() - self.start
        s.audio_seconds = s.num_samples / sample_rate if sample_rate else 0.0
        s.real_time_factor = s.total_seconds / s.audio_seconds if s.audio_seconds else 0.0
        metrics.REQUEST.observe(s.total_seconds)
        if s.audio_seconds:
            metrics.RTF.observe(s.real_time_factor)
            metrics.AUDIO_TURNS.inc()
            if self.stalls:
                metrics.STALLED_TURNS.inc()
        return s
