"""Build the gateway from its settings and serve it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from moss.speech.v1 import gateway_pb2, gateway_pb2_grpc

from services.common.auth import KEYS_ENV, load_keys
from services.common.metrics import start_metrics_server
from services.common.server import serve
from services.common.tls import ChannelTls, ServerTls
from services.gateway import metrics
from services.gateway.admission import Admission
from services.gateway.backends import HEALTH_CHECK_SECONDS, Backends
from services.gateway.pipeline import TurnLimits
from services.gateway.servicer import GatewayServicer

log = logging.getLogger(__name__)


@dataclass
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9091
    # Replicas of each stage (backends.py): a session stays on its llm replica, new ones go to the least loaded.
    llm_targets: list[str] = field(default_factory=lambda: ["127.0.0.1:50052"])
    vocoder_targets: list[str] = field(default_factory=lambda: ["127.0.0.1:50053"])
    max_text_chars: int = 2000
    max_new_tokens: int = 2048
    default_timeout: float = 120.0
    ready_wait: float = 10.0  # seconds a turn waits for a backend that is not ready (backends.py)
    health_check_seconds: float = HEALTH_CHECK_SECONDS  # how often each replica's health is asked
    max_turns: int = 256      # turns running at once (admission.py)
    max_queued_turns: int = 256  # turns waiting for a place; beyond: RESOURCE_EXHAUSTED
    api_keys_file: str | None = None  # with $MOSS_API_KEYS: the keys clients must send (auth.py); none: open
    max_message_bytes: int = 1 << 20  # a request is text and a few fields: 1 MiB is far more than max_text_chars
    max_streams_per_connection: int = 100
    session_idle_seconds: float = 300.0  # a Converse session with no message and no turn for this long ends
    tls: ServerTls | None = None          # TLS for clients
    backend_tls: ChannelTls | None = None  # TLS (mutual, with a certificate) to llm and vocoder


async def run(s: GatewaySettings) -> None:
    backends = Backends(s.llm_targets, s.vocoder_targets, s.ready_wait, s.backend_tls, s.health_check_seconds)
    servicer = GatewayServicer(backends, TurnLimits(s.max_text_chars, s.max_new_tokens, s.default_timeout),
                               Admission(s.max_turns, s.max_queued_turns), s.session_idle_seconds)
    api_keys = load_keys(s.api_keys_file)
    if not api_keys:
        log.warning("gateway: no API keys (--api-keys-file, $%s): any client may call it", KEYS_ENV)
    start_metrics_server(s.host, s.metrics_port)
    await serve(
        name="gateway",
        full_service_name=gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
        host=s.host,
        port=s.port,
        add_servicer=lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server),
        on_done=metrics.observe_request,
        on_stop=backends.close,
        readiness=backends.watch,
        api_keys=api_keys,
        max_message_bytes=s.max_message_bytes,
        max_streams_per_connection=s.max_streams_per_connection,
        tls=s.tls,
    )
