"""A Synthesize client: collects the streamed audio and timings (used by `moss-serve say`, the demo
and the tests)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

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
    client_ttfa: float = 0.0   # call start → first audio bytes, measured here
    client_total: float = 0.0

    @property
    def samples(self) -> np.ndarray:
        return decode_pcm(b"".join(self.chunks), self.format)


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
            kind = msg.WhichOneof("kind")
            if kind == "metadata":
                result.request_id = msg.metadata.request_id
                result.sample_rate, result.format = msg.metadata.sample_rate, msg.metadata.format
            elif kind == "audio":
                if not result.chunks:
                    result.client_ttfa = time.perf_counter() - start
                result.chunks.append(msg.audio.pcm)
                result.offsets.append(msg.audio.sample_offset)
            elif kind == "summary":
                result.summary = msg.summary
    result.client_total = time.perf_counter() - start
    return result
