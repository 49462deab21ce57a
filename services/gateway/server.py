"""Build the gateway from its settings and serve it."""

from __future__ import annotations

import logging

from moss.speech.v1 import gateway_pb2, gateway_pb2_grpc

from services.common.auth import KEYS_ENV, load_keys
from services.common.metrics import start_metrics_server
from services.common.server import serve
from services.gateway import metrics
from services.gateway.admission import START_QUIET_MAX, Admission
from services.gateway.backends import Backends
from services.gateway.headroom import Headroom, HeadroomRule
from services.gateway.servicer import GatewayServicer
from services.gateway.settings import ADDRESS_SHARE, GatewaySettings
from services.gateway.speech import Speech
from services.gateway.turn_request import TRANSPORT_SLACK, TurnLimits
from services.gateway.voice_book import VoiceBook
from services.gateway.voice_owners import VoiceOwners

log = logging.getLogger(__name__)


async def run(s: GatewaySettings) -> None:
    backends = Backends(s.llm_targets, s.vocoder_targets, s.ready_wait, s.backend_tls, s.health_check_seconds,
                        encoder_targets=s.encoder_targets)
    api_keys = load_keys(s.api_keys_file)
    if not api_keys:
        log.warning("gateway: no API keys (--api-keys-file, $%s): any client may call it", KEYS_ENV)
    per_client = per_client_limit(s, keyed=bool(api_keys))
    speech = Speech(backends, TurnLimits(s.max_text_chars, s.max_new_tokens, s.default_timeout, s.max_message_bytes),
                    Admission(s.turns_at_once(), s.max_queued_turns, per_client, headroom(s), s.max_starting_turns or 0,
                              s.admit_start_quiet or 0.0))
    log.info("gateway: %s", admission_line(s, per_client))
    backends.voice_owners = VoiceOwners(s.voice_owners)
    if api_keys and s.voice_owners is None:
        log.warning("gateway: API keys but no --voice-owners: the voices each key makes through the API are kept "
                    "from the other keys only until this gateway restarts")
    voices = VoiceBook(backends, backends.voice_owners, s.max_voices_per_key)
    servicer = GatewayServicer(speech, s.session_idle_seconds, voices)
    ready = [False]  # as the gRPC health check says (readiness below), for the HTTP door's /readyz

    async def readiness(set_serving):
        async def both(serving: bool) -> None:
            ready[0] = serving
            await set_serving(serving)

        try:
            await backends.watch(both, on_slots=speech.admission.cap_turns)
        finally:  # stopping: /readyz says so at once, as gRPC's health does, so that balancers drain this gateway
            ready[0] = False

    http = None
    if s.http_port:
        from services.gateway.http_server import DoorLimits, HttpDoor  # (aiohttp: ~0.5 s of imports, only where on)

        limits = DoorLimits(s.max_message_bytes, s.client_stall_seconds or None, s.http_request_seconds,
                            s.session_idle_seconds, s.origins())
        http = HttpDoor(speech, api_keys, limits, lambda: ready[0], voices)
        await http.start(s.host, s.http_port, s.tls.ssl_context() if s.tls else None)

    async def stop() -> None:
        if http is not None:
            await http.stop()
        await backends.close()

    start_metrics_server(s.host, s.metrics_port)
    await serve(
        name="gateway",
        full_service_name=gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
        host=s.host,
        port=s.port,
        add_servicer=lambda server: gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server),
        on_done=metrics.observe_request,
        on_stop=stop,
        readiness=readiness,
        api_keys=api_keys,
        max_message_bytes=TRANSPORT_SLACK * s.max_message_bytes,  # (the gateway answers those over the limit itself)
        max_streams_per_connection=s.max_streams_per_connection,
        tls=s.tls,
        write_timeout=s.client_stall_seconds or None,
        on_stalled=metrics.observe_stalled,
    )


def per_client_limit(s: GatewaySettings, keyed: bool) -> int:
    """--max-turns-per-client, or its default: a key names one client; an address may be many (a NAT), so it gets a
    smaller share (this host's own addresses are not counted at all: admission.client_id)."""
    if s.max_turns_per_client is not None:
        return s.max_turns_per_client
    return max(1, s.turns_at_once() // (2 if keyed else ADDRESS_SHARE))


def admission_line(s: GatewaySettings, per_client: int) -> str:
    """The limits this gateway admits turns by, for its start-up log: `moss-serve up` chooses some of them (on a GPU
    --max-turns is the vocoders' stream-history slots), and an operator should not have to read its code to know."""
    turns = s.turns_at_once()
    rule = (f"by headroom, from {initial_turns(s)} turns" if s.admission == "headroom"
            else "by count")
    return (f"admission {rule}; at most {turns} turns running (--max-turns), {s.max_queued_turns} waiting, "
            f"{s.max_starting_turns or 'any number'} starting, {per_client or 'no limit of its own'} per client "
            f"(an API key, else an address other than this host's)"
            + (f"; an admitted turn starts after {1e3 * s.admit_start_quiet:.0f} ms without a new call (at most "
               f"{1e3 * START_QUIET_MAX:.0f} ms)" if s.admit_start_quiet else ""))


def initial_turns(s: GatewaySettings) -> int:
    """--admit-initial-turns, or the rule's default, within --max-turns."""
    return min(s.admit_initial_turns or HeadroomRule.initial_limit, s.turns_at_once())


def headroom(s: GatewaySettings) -> Headroom | None:
    """The headroom rule of the settings (None under count admission). Its least limit is the rule's, or the initial
    limit where that is lower: a stack started at 2 turns (a 2-core CPU's: docs/admission.md) is not let fall back to 4."""
    if s.admission != "headroom":
        return None
    turns, initial = s.turns_at_once(), initial_turns(s)
    burst = HeadroomRule.burst_turns if s.admit_burst_turns is None else s.admit_burst_turns
    return Headroom(HeadroomRule(initial_limit=initial, max_limit=turns,
                                 min_limit=min(HeadroomRule.min_limit, initial), low_slack=s.admit_low_slack,
                                 high_slack=(s.admit_high_slack if s.admit_high_slack is not None
                                             else max(HeadroomRule.high_slack, 2 * s.admit_low_slack)), ttfa_target=s.admit_ttfa,
                                 growth=s.admit_growth, burst_turns=min(burst, turns),
                                 burst_window=s.admit_burst_window))
