"""moss.speech.v1.Vocoder: one config message, token chunks, end → PCM chunks as each is ready.

The model runs on one worker thread shared by all streams (batching across streams comes later), so the
event loop keeps serving while a chunk is synthesized.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from moss.speech.v1 import vocoder_pb2, vocoder_pb2_grpc

from services.common.audio import encode_pcm, resolve_format
from services.common.errors import InvalidArgument
from services.vocoder import metrics
from services.vocoder.streamer import MelStreamer
from services.vocoder.vocoder import TokenVocoder

MAX_TOKENS_PER_MESSAGE = 4096


class VocoderServicer(vocoder_pb2_grpc.VocoderServicer):
    def __init__(self, vocoder: TokenVocoder, left_context: int | None = None, lookahead: int | None = None):
        """left_context / lookahead in mel frames: None takes MelStreamer's defaults."""
        self.vocoder = vocoder
        self.left_context, self.lookahead = left_context, lookahead
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vocoder")

    def _check_tokens(self, tokens) -> list[int]:
        if len(tokens) > MAX_TOKENS_PER_MESSAGE:
            raise InvalidArgument("tokens.tokens", f"at most {MAX_TOKENS_PER_MESSAGE} tokens per message, got {len(tokens)}")
        bad = [t for t in tokens if not 0 <= t < self.vocoder.codebook_size]
        if bad:
            raise InvalidArgument("tokens.tokens", f"codes must be in [0, {self.vocoder.codebook_size}), got {bad[0]}")
        return list(tokens)

    async def _compute(self, fn, *args) -> tuple[np.ndarray, float, float]:
        """Run fn on the model thread → (samples, queue seconds, compute seconds)."""
        submitted = time.perf_counter()
        started = []

        def timed():
            started.append(time.perf_counter())
            return fn(*args)

        samples = await asyncio.get_running_loop().run_in_executor(self.executor, timed)
        done = time.perf_counter()
        return samples, started[0] - submitted, done - started[0]

    async def Vocode(self, request_iterator, context):
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("kind") != "config":
            raise InvalidArgument("config", "the first message of a Vocode stream must be a config")
        fmt = resolve_format(first.config.format, "config.format")
        rate = self.vocoder.sample_rate
        streamer = MelStreamer(self.vocoder, self.left_context, self.lookahead)
        stats = vocoder_pb2.VocodeStats()
        offset = 0
        first_tokens_at: float | None = None

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
                first_tokens_at = first_tokens_at or time.perf_counter()
                samples, queued, compute = await self._compute(streamer.push, tokens)
                stats.chunks += 1
                stats.tokens += len(tokens)
                stats.compute_seconds += compute
                stats.queue_seconds += queued
                metrics.observe_chunk(queued, compute)
                if stats.chunks == 1:
                    stats.first_chunk_compute_seconds = compute
                    metrics.observe_first_chunk(time.perf_counter() - first_tokens_at)
                if len(samples):
                    yield message(samples, final=False)
            samples, queued, compute = await self._compute(streamer.flush)
            stats.compute_seconds += compute
            stats.queue_seconds += queued
            final = message(samples, final=True)
            final.stats.CopyFrom(stats)
            metrics.observe_audio(offset / rate)
            yield final
        finally:
            metrics.ACTIVE_STREAMS.dec()
