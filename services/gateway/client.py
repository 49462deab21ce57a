"""Clients of the gateway, used by `moss-serve say` and `chat`, the demo and the tests.

- `synthesize(...)`: one Synthesize call → a SynthesisResult (audio, timings); `print_timings` shows one.
- `converse(...)`: a Converse session, as an async context manager → a Conversation:

      async with converse("localhost:50051", sampling=...) as conv:
          first = await conv.say("Hello!")           # one whole turn → a SynthesisResult (plus its text)
          await conv.send("Tell me more.")           # or drive a turn message by message:
          async for msg in conv.replies():           #   metadata, audio, text, then summary
              ...                                    #   (or, after conv.cancel(), cancelled)
          spoken = await conv.speak(samples, 16000)  # a spoken turn: audio streamed as if spoken, then the reply
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.common.audio import decode_pcm
from services.common.auth import bearer
from services.common.tls import ChannelTls, channel


@dataclass
class SynthesisResult:
    request_id: str = ""
    sample_rate: int = 0
    format: int = 0
    chunks: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    summary: gateway_pb2.SynthesisSummary | None = None
    client_ttfa: float = 0.0   # call (or turn) start → first audio bytes, measured here
    client_total: float = 0.0
    text: str = ""             # Converse: the text the model emitted alongside the audio
    cancelled: gateway_pb2.TurnCancelled | None = None  # Converse: the turn was cancelled (no summary then)
    failed: gateway_pb2.TurnFailed | None = None        # Converse: the turn failed, the session goes on
    speech_started: gateway_pb2.UserSpeechStarted | None = None  # Converse, a spoken turn: as the gateway found it
    speech_ended: gateway_pb2.UserSpeechEnded | None = None

    @property
    def samples(self) -> np.ndarray:
        return decode_pcm(b"".join(self.chunks), self.format)

    def take(self, msg, start: float) -> None:
        """Add one message of a Synthesize stream, or of a Converse turn; start: when the call (turn) began."""
        kind = msg.WhichOneof("kind")
        if kind == "metadata":
            self.request_id = msg.metadata.request_id
            self.sample_rate, self.format = msg.metadata.sample_rate, msg.metadata.format
        elif kind == "audio":
            if not self.chunks:
                self.client_ttfa = time.perf_counter() - start
            self.chunks.append(msg.audio.pcm)
            self.offsets.append(msg.audio.sample_offset)
        elif kind == "text":
            self.text += msg.text.text
        elif kind == "summary":
            self.summary = msg.summary
        elif kind == "cancelled":
            self.cancelled = msg.cancelled
        elif kind == "failed":
            self.failed = msg.failed
        elif kind == "speech_started":
            self.speech_started = msg.speech_started
        elif kind == "speech_ended":
            self.speech_ended = msg.speech_ended


async def synthesize(
    target: str, text: str, *, voice: str = "", fmt: int = common_pb2.AUDIO_FORMAT_PCM16,
    sampling: common_pb2.SamplingParams | None = None, timeout: float = 120.0, api_key: str | None = None,
    tls: ChannelTls | None = None,
) -> SynthesisResult:
    result = SynthesisResult()
    request = gateway_pb2.SynthesizeRequest(text=text, voice=voice, format=fmt, sampling=sampling)
    start = time.perf_counter()
    async with channel(target, tls) as ch:
        async for msg in gateway_pb2_grpc.GatewayStub(ch).Synthesize(request, timeout=timeout, metadata=bearer(api_key)):
            result.take(msg, start)
    result.client_total = time.perf_counter() - start
    return result


class Conversation:
    """An open Converse call (see the module's docstring). One turn at a time: send() a turn, then read its
    replies() to the end; say() does both."""

    def __init__(self, call):
        self.call = call
        self.session_id = ""
        self.ended: gateway_pb2.SessionEnded | None = None
        self.turns_sent = 0  # the gateway numbers turns from 1 in the order they came

    async def _write(self, request: gateway_pb2.ConverseRequest) -> None:
        """Send, or raise the call's own status if it has ended (a write to an ended call fails with a bare
        INTERNAL that hides why it ended: RESOURCE_EXHAUSTED, UNAVAILABLE, ...)."""
        try:
            await self.call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._raise_status()
            raise

    async def _raise_status(self) -> None:
        code = await self.call.code()
        if code != grpc.StatusCode.OK:
            raise grpc.aio.AioRpcError(code, await self.call.initial_metadata(), await self.call.trailing_metadata(),
                                       details=await self.call.details())

    async def start(self, config: gateway_pb2.SessionConfig) -> None:
        """Open the session: send its config, wait for SessionStarted."""
        await self._write(gateway_pb2.ConverseRequest(config=config))
        first = await self.call.read()
        if first is grpc.aio.EOF or first.WhichOneof("kind") != "session":
            await self._raise_status()
            raise RuntimeError("Converse: the gateway did not start a session")
        self.session_id = first.session.session_id

    async def send(self, text: str, sampling: common_pb2.SamplingParams | None = None,
                   reply: int = gateway_pb2.REPLY_MODALITY_SPEECH) -> None:
        """Start a turn (one running is cancelled first, by the gateway); sampling: this turn's own."""
        await self._write(gateway_pb2.ConverseRequest(turn=gateway_pb2.UserTurn(text=text, sampling=sampling, reply=reply)))
        self.turns_sent += 1

    async def cancel(self) -> None:
        """Barge-in: stop the turn running; its replies() end with a `cancelled` message."""
        await self._write(gateway_pb2.ConverseRequest(cancel=gateway_pb2.CancelTurn()))

    async def send_speech(self, samples: np.ndarray, sample_rate: int, *, chunk_seconds: float = 0.1,
                          realtime: bool = True, detect_speech: bool = False, end_silence_seconds: float = 0.0,
                          reply: int = gateway_pb2.REPLY_MODALITY_SPEECH,
                          sampling: common_pb2.SamplingParams | None = None) -> float:
        """A spoken turn's audio: `samples` (float, mono) streamed as PCM16 in chunks, each once the one before has
        played (realtime) or at once; then EndOfSpeech (without detect_speech: with it, the gateway finds the end)
        → when the speech ended (time.perf_counter()): read before EndOfSpeech is written, not once the write returns,
        which on a busy client can be after the reply's first audio has arrived."""
        await self._write(gateway_pb2.ConverseRequest(speech=gateway_pb2.SpeechInput(
            sample_rate=sample_rate, format=common_pb2.AUDIO_FORMAT_PCM16, detect_speech=detect_speech,
            end_silence_seconds=end_silence_seconds, sampling=sampling, reply=reply)))
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
        step = max(1, int(chunk_seconds * sample_rate))
        started = time.perf_counter()
        for i in range(0, len(pcm), step):
            if realtime:
                await asyncio.sleep(max(0.0, started + i / sample_rate - time.perf_counter()))
            await self._write(gateway_pb2.ConverseRequest(audio=gateway_pb2.UserAudio(pcm=pcm[i : i + step].tobytes())))
        if realtime:  # the last chunk is spoken to its end before the speech ends
            await asyncio.sleep(max(0.0, started + len(pcm) / sample_rate - time.perf_counter()))
        ended = time.perf_counter()
        if not detect_speech:
            await self._write(gateway_pb2.ConverseRequest(end_of_speech=gateway_pb2.EndOfSpeech()))
        self.turns_sent += 1
        return ended

    async def speak(self, samples: np.ndarray, sample_rate: int, **options) -> SynthesisResult:
        """One spoken turn (send_speech's options) → its reply, whose client_ttfa runs from the end of the speech
        (EndOfSpeech sent)."""
        end = await self.send_speech(samples, sample_rate, **options)
        result = SynthesisResult()
        async for msg in self.replies():
            result.take(msg, end)
        result.client_total = time.perf_counter() - end
        return result

    async def replies(self) -> AsyncIterator[gateway_pb2.ConverseResponse]:
        """The current turn's messages, through its summary, cancelled or failed message. Ends early if the
        session ends."""
        while True:
            msg = await self.call.read()
            if msg is grpc.aio.EOF:
                await self._raise_status()
                return
            kind = msg.WhichOneof("kind")
            if kind == "ended":
                self.ended = msg.ended
                return
            yield msg
            if kind in ("summary", "cancelled", "failed") and msg.turn >= self.turns_sent:
                return  # (a turn before it, cancelled by this one, ends with it too: not the end of this one)

    async def say(self, text: str, sampling: common_pb2.SamplingParams | None = None,
                  reply: int = gateway_pb2.REPLY_MODALITY_SPEECH) -> SynthesisResult:
        """One whole turn: its audio, text and summary (or `failed`: the session goes on)."""
        result = SynthesisResult()
        start = time.perf_counter()
        await self.send(text, sampling, reply)
        async for msg in self.replies():
            if msg.turn == self.turns_sent:  # (not a late message of a turn before it)
                result.take(msg, start)
        result.client_total = time.perf_counter() - start
        return result

    async def close(self) -> gateway_pb2.SessionEnded | None:
        """End the session (a turn running is cancelled) and wait for the gateway's SessionEnded."""
        if self.ended is None:
            await self._write(gateway_pb2.ConverseRequest(close=gateway_pb2.CloseSession()))
            while self.ended is None:
                msg = await self.call.read()
                if msg is grpc.aio.EOF:
                    break
                if msg.WhichOneof("kind") == "ended":
                    self.ended = msg.ended
        return self.ended


@contextlib.asynccontextmanager
async def converse(
    target: str, *, voice: str = "", system_prompt: str = "", fmt: int = common_pb2.AUDIO_FORMAT_PCM16,
    sampling: common_pb2.SamplingParams | None = None, chunking: common_pb2.ChunkPolicy | None = None,
    timeout: float | None = None, api_key: str | None = None, tls: ChannelTls | None = None,
) -> AsyncIterator[Conversation]:
    """Open a Converse session; closed (and the channel with it) when the block ends. timeout: seconds for
    the whole call (None: no deadline)."""
    config = gateway_pb2.SessionConfig(voice=voice, system_prompt=system_prompt, format=fmt, sampling=sampling,
                                       chunking=chunking)
    async with channel(target, tls) as ch:
        call = gateway_pb2_grpc.GatewayStub(ch).Converse(timeout=timeout, metadata=bearer(api_key))
        conv = Conversation(call)
        try:
            await conv.start(config)
            yield conv
            await conv.close()
        finally:
            call.cancel()


def print_timings(result: SynthesisResult, path: str | None) -> None:
    """The turn's per-stage timings, as `moss-serve say` and `make demo` print them (path: where its audio went;
    None: a text reply)."""
    s = result.summary
    spoken = [("user speech encoded", s.user_audio_seconds, "s"), ("encoder: end of speech → codes", s.encoder_finish_seconds, "ms"),
              ("end of speech → first audio", s.speech_end_to_first_audio_seconds, "ms")] if s.user_codes else []
    for name, value, unit in spoken:
        print(f"  {name:<32} {value * (1000 if unit == 'ms' else 1):9.{1 if unit == 'ms' else 2}f} {unit}")
    if path is None:
        print(f"  {'llm prefill':<32} {s.llm_prefill_seconds * 1000:9.1f} ms")
        print(f"  {'total (gateway)':<32} {s.total_seconds * 1000:9.1f} ms")
        return
    rows = [
        ("time to first audio (client)", result.client_ttfa),
        ("time to first audio (gateway)", s.ttfa_seconds),
        ("admission wait", s.admission_wait_seconds),
        ("llm queue", s.llm_queue_seconds),
        ("llm prefill", s.llm_prefill_seconds),
        ("llm first chunk at gateway", s.llm_first_chunk_seconds),
        ("llm first chunk in the llm", s.llm_first_chunk_in_llm_seconds),
        ("llm decode (all tokens)", s.llm_decode_seconds),
        ("vocoder first chunk queue", s.vocoder_first_chunk_queue_seconds),
        ("vocoder first chunk compute", s.vocoder_first_chunk_seconds),
        ("vocoder first chunk in vocoder", s.vocoder_first_chunk_in_vocoder_seconds),
        ("vocoder compute (all chunks)", s.vocoder_compute_seconds),
        ("total (gateway)", s.total_seconds),
    ]
    print(f"wrote {path}: {s.audio_seconds:.2f} s of audio, {s.audio_tokens} tokens, {len(result.chunks)} chunks, "
          f"{result.sample_rate} Hz")
    for name, seconds in rows:
        print(f"  {name:<32} {seconds * 1000:9.1f} ms")
    print(f"  {'real-time factor':<32} {s.real_time_factor:9.3f}")
