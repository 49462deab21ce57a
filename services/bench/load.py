"""Drives the gateway: requests at a fixed concurrency or on Poisson arrivals, each stream recorded as it
arrives (stream.py). A request is a Synthesize call, or with `turns` a Converse session of that many turns:
each turn is sent once the reply before it has played out at the client, plus `turn_gap` (a listener who
hears the reply, then speaks), and is recorded as a stream of its own. With `speech`, each turn is spoken: the
audio streamed as it would be spoken, then its end; the turn's clock (its TTFA) starts at the end of the speech.
With `barge_in` too, each session is hands-free and barges in by voice (one_barge_in).
Nothing here blocks the event loop; the progress bar writes to stderr."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass

import grpc
import numpy as np
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.bench.stream import StreamRecord
from services.bench.workload import poisson_arrivals
from services.common.auth import bearer
from services.common.tls import ChannelTls, channel
from services.gateway.client import Conversation

TOKEN_SECONDS = 0.08       # audio per token (12.5 tokens a second)
STREAMS_PER_CHANNEL = 64  # HTTP/2 connections to spread the streams over (servers cap streams per connection)


@dataclass
class LoadSpec:
    target: str
    prompts: list[str]
    requests: int | None            # per level; None: requests_for() decides
    concurrency: int = 1            # fixed concurrency (with rate None)
    ramp: float = 0.0               # seconds over which the fixed-concurrency streams start, evenly (0: all at once)
    rate: float | None = None       # Poisson arrivals, requests per second
    max_new_tokens: int = 75        # 6 s of audio at 80 ms per token...
    min_new_tokens: int = 75        # ... made exact by suppressing the end of speech before it
    timeout: float = 120.0
    first_chunk_tokens: int | None = None  # the requests' ChunkPolicy (None: the gateway's default)
    api_key: str | None = None             # sent as authorization: Bearer <key>
    tls: ChannelTls | None = None          # reach the gateway over TLS
    seed: int = 0
    progress: bool = True
    turns: int = 0                         # > 0: each request is a Converse session of this many turns
    turn_gap: float = 0.5                  # seconds between a reply played out and the next turn
    speech: tuple[np.ndarray, int] | None = None  # (samples, rate): every turn spoken, as a Converse session's
    reply_seconds: tuple[float, float] | None = None  # each reply's length uniform in [lo, hi] s, exact (not max/min)
    arrival_seconds: float = 30.0          # with rate and no requests: seconds of arrivals
    barge_in: float | None = None          # with speech: hands-free sessions speaking again this many seconds into
                                           # their first reply's audio (one_barge_in)
    encoder_metrics: str | None = None     # the encoder's /metrics URL: its places in use sampled per level

    def requests_for(self) -> int:
        """The level's request count: as given, or 4 per concurrent stream (at least 8), or arrival_seconds of
        arrivals."""
        if self.requests:
            return self.requests
        return max(8, round(self.arrival_seconds * self.rate)) if self.rate else max(8, 4 * self.concurrency)

    def sampling(self, i: int) -> common_pb2.SamplingParams:
        """Request i's sampling: a fixed length, or with reply_seconds its own, drawn from (seed, i) alone, so
        that a rerun, or another rate of a sweep, asks for the same lengths."""
        low, high = self.min_new_tokens, self.max_new_tokens
        if self.reply_seconds is not None:
            seconds = random.Random(self.seed * 1_000_003 + i).uniform(*self.reply_seconds)
            low = high = max(1, round(seconds / TOKEN_SECONDS))
        return common_pb2.SamplingParams(max_new_tokens=high, seed=self.seed + i, min_new_tokens=min(low, high))


    def chunking(self) -> common_pb2.ChunkPolicy | None:
        return None if self.first_chunk_tokens is None else common_pb2.ChunkPolicy(first_chunk_tokens=self.first_chunk_tokens)


async def one_request(stub, text: str, prompt: int, sampling, timeout: float,
                      chunking: common_pb2.ChunkPolicy | None = None, api_key: str | None = None) -> StreamRecord:
    record = StreamRecord(sent=time.perf_counter(), prompt=prompt)
    try:
        request = gateway_pb2.SynthesizeRequest(text=text, sampling=sampling, chunking=chunking)
        async for msg in stub.Synthesize(request, timeout=timeout, metadata=bearer(api_key)):
            take(record, msg)
    except grpc.aio.AioRpcError as err:
        failed(record, err)
    record.done = time.perf_counter()
    return record


def failed(record: StreamRecord, err: grpc.aio.AioRpcError) -> None:
    """The call's error status into its record, with the retry hint a refusal carries (`retry-after-ms`)."""
    record.code, record.error = err.code().name, err.details() or ""
    hint = dict(err.trailing_metadata() or ()).get("retry-after-ms")
    record.retry_after = float(hint) / 1000 if hint is not None else None


def take(record: StreamRecord, msg) -> None:
    """One message of a Synthesize stream, or of a Converse turn, into its record."""
    kind = msg.WhichOneof("kind")
    if kind == "audio":
        record.chunks.append((time.perf_counter(), msg.audio.num_samples))
    elif kind == "metadata":
        record.sample_rate = msg.metadata.sample_rate
    elif kind == "summary":  # every field of the gateway's SynthesisSummary, zeros included
        record.stages = {f.name: getattr(msg.summary, f.name) for f in msg.summary.DESCRIPTOR.fields}


async def one_session(stub, texts: list[tuple[int, str]], sampling, spec: LoadSpec) -> list[StreamRecord]:
    """A Converse session: its turns one after another (texts: (prompt index, text) each) → a record per turn
    sent. The session ends after its last turn, or at the first turn that fails."""
    records: list[StreamRecord] = []
    call = stub.Converse(timeout=spec.timeout, metadata=bearer(spec.api_key))
    conv = Conversation(call)
    try:
        await conv.start(gateway_pb2.SessionConfig(sampling=sampling, chunking=spec.chunking()))
        for turn, (prompt, text) in enumerate(texts, 1):
            if records:  # the listener hears the last reply out, then speaks
                last = records[-1]
                await asyncio.sleep(max(0.0, last.chunks[0][0] + last.audio_seconds + spec.turn_gap - time.perf_counter()))
            if spec.speech is not None:  # as the user speaks it: the encoder works meanwhile
                sent = await conv.send_speech(*spec.speech)  # (its end)
            else:
                sent = time.perf_counter()
                await conv.send(text)
            record = StreamRecord(sent=sent, prompt=prompt, turn=turn)
            records.append(record)
            async for msg in conv.replies():
                take(record, msg)
                if msg.WhichOneof("kind") == "failed":
                    record.code, record.error = msg.failed.code, msg.failed.message
                    record.retry_after = msg.failed.retry_after_seconds or None
            record.done = time.perf_counter()
            if not record.ok:
                if record.code == "OK":
                    record.code, record.error = "UNKNOWN", "the turn ended without audio"
                break
        await conv.close()
    except grpc.aio.AioRpcError as err:
        if not records:
            records.append(StreamRecord(sent=time.perf_counter(), turn=1))
        failed(records[-1], err)
        records[-1].done = time.perf_counter()
    finally:
        call.cancel()
    return records


QUIET_SECONDS = 0.5        # silence around a hands-free utterance, as a person pauses
END_SILENCE_SECONDS = 0.3  # the silence after which the gateway ends a hands-free turn (SpeechInput.end_silence_seconds)
CHUNK_SECONDS = 0.1        # the audio's pieces, each sent once the one before has played


async def one_barge_in(stub, sampling, spec: LoadSpec) -> list[StreamRecord]:
    """A hands-free session (the gateway finds where speech starts and ends) that barges in by voice: the user speaks,
    and `spec.barge_in` seconds after the reply's first audio speaks again over it → its two turns' records. Turn 1's
    `barged_in`: its last audio's arrival less the moment the second speech began (the stop as the client sees it;
    negative where none came after), and `cancelled_after`: its TurnCancelled's arrival less that moment.
    Turn 2's clock starts when the second speech's last sound was sent: its TTFA holds the gateway's wait for
    END_SILENCE_SECONDS of quiet, as a hands-free user's does."""
    samples, rate = spec.speech
    quiet = np.zeros(int(QUIET_SECONDS * rate), np.float32)
    pcm = (np.clip(np.concatenate([quiet, samples, quiet]), -1, 1) * 32767).astype("<i2")
    speech_from, speech_to = len(quiet), len(quiet) + len(samples)   # the sound's samples
    step = int(CHUNK_SECONDS * rate)
    records = {1: StreamRecord(sent=time.perf_counter(), turn=1), 2: StreamRecord(sent=time.perf_counter(), turn=2)}
    call = stub.Converse(timeout=spec.timeout, metadata=bearer(spec.api_key))
    conv = Conversation(call)
    first_audio, answered, cancelled = asyncio.Event(), asyncio.Event(), []

    async def speak() -> tuple[float, float]:
        """The utterance in real time → (when its sound began, when its sound ended) on the client's clock."""
        began = ended = started = time.perf_counter()
        for i in range(0, len(pcm), step):
            await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
            # Timed as the piece is handed over, not once the write returns: the reply's last audio and its cancel can
            # arrive (and be timed by the reader) before this coroutine runs again, ~0.2 s later on a busy 2-core CPU.
            now = time.perf_counter()
            await call.write(gateway_pb2.ConverseRequest(audio=gateway_pb2.UserAudio(pcm=pcm[i : i + step].tobytes())))
            if i <= speech_from < i + step:
                began = now
            if i < speech_to <= i + step:
                ended = now
        return began, ended

    async def read() -> None:
        try:
            while (msg := await call.read()) is not grpc.aio.EOF:
                kind = msg.WhichOneof("kind")
                if kind == "ended":
                    break
                record = records.get(msg.turn)
                if record is None:
                    continue
                take(record, msg)
                if kind == "failed":
                    record.code, record.error = msg.failed.code, msg.failed.message
                    record.retry_after = msg.failed.retry_after_seconds or None
                if msg.turn == 1 and kind in ("audio", "failed"):
                    first_audio.set()
                if msg.turn == 1 and kind == "cancelled":
                    cancelled.append(time.perf_counter())
                if msg.turn == 2 and kind in ("summary", "failed", "cancelled"):
                    answered.set()
        finally:  # the call ended (or failed): nobody waits in vain
            first_audio.set()
            answered.set()

    reader, spoke_twice = None, False
    try:
        await conv.start(gateway_pb2.SessionConfig(sampling=sampling, chunking=spec.chunking()))
        reader = asyncio.create_task(read())
        await call.write(gateway_pb2.ConverseRequest(speech=gateway_pb2.SpeechInput(
            sample_rate=rate, format=common_pb2.AUDIO_FORMAT_PCM16, detect_speech=True,
            end_silence_seconds=END_SILENCE_SECONDS)))
        _, records[1].sent = await speak()
        await first_audio.wait()
        if records[1].ok:
            await asyncio.sleep(spec.barge_in)
            spoke_twice = True
            began, records[2].sent = await speak()
            await answered.wait()
            records[1].barged_in = records[1].chunks[-1][0] - began
            records[1].cancelled_after = cancelled[0] - began if cancelled else None
        await call.write(gateway_pb2.ConverseRequest(close=gateway_pb2.CloseSession()))
        await asyncio.wait_for(reader, spec.timeout)
    except grpc.aio.AioRpcError as err:
        failed(records[2] if spoke_twice else records[1], err)
    finally:
        call.cancel()
        if reader is not None:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    kept = [records[1], records[2]] if spoke_twice else [records[1]]
    for record in kept:
        record.done = record.done or time.perf_counter()
        if record.code == "OK" and not record.chunks:
            record.code, record.error = "UNKNOWN", "the turn ended without audio"
    return kept


class _Progress:
    def __init__(self, total: int, label: str, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="req", file=sys.stderr, leave=False, dynamic_ncols=True)
        self.errors = 0

    def update(self, record: StreamRecord) -> None:
        self.errors += record.code != "OK"
        if self.bar is not None:
            self.bar.set_postfix(errors=self.errors, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


async def run_load(spec: LoadSpec, label: str = "") -> tuple[list[StreamRecord], float]:
    """→ (one record per request, a session's turns one each, in the order sent; wall seconds of the whole level)."""
    total = spec.requests_for()
    width = min(spec.concurrency if spec.rate is None else total, total)
    # A local subchannel pool per channel: otherwise channels to one target share one connection, and the
    # gateway's --max-streams-per-connection would hold back the calls beyond it.
    channels = [channel(spec.target, spec.tls, [("grpc.use_local_subchannel_pool", 1)])
                for _ in range(-(-width // STREAMS_PER_CHANNEL))]
    stubs = [gateway_pb2_grpc.GatewayStub(c) for c in channels]
    progress = _Progress(total, label, spec.progress)
    records: list[list[StreamRecord]] = [[] for _ in range(total)]

    async def request(i: int) -> None:
        stub = stubs[i % len(stubs)]
        if spec.barge_in is not None and spec.speech is not None:
            records[i] = await one_barge_in(stub, spec.sampling(i), spec)
        elif spec.turns or spec.speech is not None:
            texts = [((i + k) % len(spec.prompts), spec.prompts[(i + k) % len(spec.prompts)]) for k in range(max(spec.turns, 1))]
            records[i] = await one_session(stub, texts, spec.sampling(i), spec)
        else:
            prompt = i % len(spec.prompts)
            records[i] = [await one_request(stub, spec.prompts[prompt], prompt, spec.sampling(i), spec.timeout,
                                            spec.chunking(), spec.api_key)]
        progress.update(records[i][-1])

    start = time.perf_counter()
    try:
        if spec.rate is None:
            queue = iter(range(width, total))

            async def worker(slot: int) -> None:  # request `slot` first, at its place in the ramp
                await asyncio.sleep(spec.ramp * slot / width)
                await request(slot)
                for i in queue:  # a shared iterator: each later index goes to one worker
                    await request(i)

            await asyncio.gather(*(worker(slot) for slot in range(width)))
        else:
            async def at(offset: float, i: int) -> None:
                await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
                await request(i)

            await asyncio.gather(*(at(t, i) for i, t in enumerate(poisson_arrivals(spec.rate, total, spec.seed))))
    finally:
        progress.close()
        await asyncio.gather(*(c.close() for c in channels))
    return [r for request_records in records for r in request_records], time.perf_counter() - start
