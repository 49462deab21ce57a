"""Build the gateway from its settings and serve it."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from moss.speech.v1 import gateway_pb2, gateway_pb2_grpc, llm_pb2_grpc, vocoder_pb2_grpc

from services.common.metrics import start_metrics_server
from services.common.server import serve
from services.gateway import metrics
from services.gateway.pipeline import TurnLimits
from services.gateway.servicer import GatewayServicer

# A stage that restarts is found again within a second: the default backoff grows to two minutes,
# and a channel in backoff fails calls at once without trying to connect.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclass
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9091
    llm_target: str = "127.0.0.1:50052"
    vocoder_target: str = "127.0.0.1:50053"
    max_text_chars: int = 2000
    max_new_tokens: int = 2048
    default_timeout: float = 120.0


async def run(s: GatewaySettings) -> None:
    llm_channel = grpc.aio.insecure_channel(s.llm_target, options=CHANNEL_OPTIONS)
    vocoder_channel = grpc.aio.insecure_channel(s.vocoder_target, options=CHANNEL_OPTIONS)
    servicer = GatewayServicer(
        llm_pb2_grpc.LlmStub(llm_channel),
        vocoder_pb2_grpc.VocoderStub(vocoder_channel),
        TurnLimits(s.max_text_chars, s.max_new_tokens, s.default_timeout),
    )
    start_metrics_server(s.host, s.metrics_port)

    async def close_channels():
        await llm_channel.close()
        await vocoder_channel.close()

    await serve(
        name="gateway",
        full_service_name=gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
        host=s.host,
        port=s.port,
        add_servicer=lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server),
        on_done=metrics.observe_request,
        on_stop=close_channels,
    )
