"""The gateway's settings, each option declared once (services/settings.py): `moss-serve gateway` takes them all,
`moss-serve up` the FORWARDED ones, which it hands on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from services.gateway.headroom import HeadroomRule
from services.settings import (
    ADMISSION,
    DOORS,
    GRPC_PORTS,
    PROCESSES,
    SECURITY,
    count,
    host_option,
    http_port_option,
    metrics_port_option,
    option,
    port_option,
    positive,
    seconds,
    share,
)

if TYPE_CHECKING:  # (grpc's: not imported for `moss-serve --help`)
    from services.common.tls import ChannelTls, ServerTls

LLM_TARGET = f"127.0.0.1:{GRPC_PORTS['llm']}"
VOCODER_TARGET = f"127.0.0.1:{GRPC_PORTS['vocoder']}"
ENCODER_TARGET = f"127.0.0.1:{GRPC_PORTS['encoder']}"
HEALTH_CHECK_SECONDS = 0.5  # how often a ready replica's health is asked (backends.py)
DEFAULT_MAX_TURNS = 256  # --max-turns when none is given (services/up.py gives one on a GPU)
ADDRESS_SHARE = 8  # without API keys, one address may have 1/8 of --max-turns at once by default (32 of 256, 16 of 128)


@dataclass
class GatewaySettings:
    GROUP: ClassVar[str] = DOORS
    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        PROCESSES: ("host", "port", "metrics_port"),
        ADMISSION: ("max_turns", "max_queued_turns", "max_starting_turns", "admission", "admit_start_quiet",
                    "admit_initial_turns", "admit_burst_turns", "admit_burst_window", "admit_low_slack",
                    "admit_high_slack", "admit_ttfa", "admit_growth", "max_turns_per_client"),
        SECURITY: ("api_keys_file", "allowed_origins", "voice_owners", "max_voices_per_key"),
    }

    host: str = host_option()
    port: int = port_option("gateway")
    metrics_port: int = metrics_port_option("gateway")
    http_port: int = http_port_option()
    # Replicas of each stage (backends.py; flags of their own in cli.py: repeatable, comma-separated): a session
    # stays on its llm replica, new ones go to the least loaded.
    llm_targets: list[str] = field(default_factory=lambda: [LLM_TARGET])
    vocoder_targets: list[str] = field(default_factory=lambda: [VOCODER_TARGET])
    encoder_targets: list[str] = field(default_factory=lambda: [ENCODER_TARGET])  # spoken turns' codes
    max_text_chars: int = option(2000, "longest user turn taken", type=positive(int))
    ready_wait: float = option(10.0, "seconds a request waits for a backend that is not ready (starting, restarting) "
                                     "before UNAVAILABLE; always within the request's deadline", type=seconds)
    health_check_seconds: float = option(HEALTH_CHECK_SECONDS, "how often a ready replica's health check is asked (one that is not "
                                              "ready: every 0.5 s at most); a replica that fails it, or that a call "
                                              "finds unreachable, gets no calls until it passes again",
                                         type=positive(float))
    api_keys_file: str | None = option(None, "a file of API keys, one per line; clients send one as 'authorization: "
                                             "Bearer <key>' (more keys: $MOSS_API_KEYS, comma-separated; none: open)")
    max_turns: int | None = option(None, f"turns running at once, at most: a ceiling, not a capacity anyone measured "
                                         f"(under it the vocoders' stream slots cap the turns, and --admission headroom "
                                         f"the limit it learns from playback; default: {DEFAULT_MAX_TURNS})",
                                   type=positive(int), show_default=False)
    max_queued_turns: int = option(256, "turns waiting for a place, each within its deadline; beyond: "
                                        "RESOURCE_EXHAUSTED with a retry hint", type=count)
    max_starting_turns: int | None = option(
        None, "turns admitted but without first audio yet (the llm's prefill, the vocoder's first chunk), at most; more "
              "wait their turn, in order, within their deadlines: a burst starts as a quick ramp (default: 16 where "
              "moss-serve up runs the stack on a GPU, else none; 0: none)", type=count, show_default=False)
    admission: str | None = option(
        None, "count: --max-turns turns at once, more queue; headroom: as many as the stages serve in time, learned "
              "from playback slack and TTFA, the rest refused at once (services/gateway/headroom.py) (default: headroom "
              "where moss-serve up runs the stack, on any device; a bare gateway: count)", choices=["count", "headroom"],
        show_default=False)
    admit_start_quiet: float | None = option(
        None, "seconds without a new call that an admitted turn waits for before it starts, at most 0.03 s, so that a "
              "burst's refusals are answered first (default: 0.005 where moss-serve up runs the stack on a CPU, whose "
              "cores the refusals share with the admitted turns' start; else 0: none)", type=seconds, show_default=False)
    admit_initial_turns: int | None = option(
        None, f"--admission headroom: turns at once before the signals say more or fewer, and the least the limit falls "
              f"to if under {HeadroomRule.min_limit} (default: {HeadroomRule.initial_limit}, an H100's; where moss-serve "
              f"up runs the stack on a CPU, one a core)", type=positive(int), show_default=False)
    admit_burst_turns: int | None = option(
        None, f"--admission headroom: turns a burst may run at once, over the limit, when it arrives at an idle stack "
              f"(none running) within --admit-burst-window seconds: the start limit starts them a few at a time, and "
              f"they play stall-free at the price of later first audio (docs/admission.md; default: "
              f"{HeadroomRule.burst_turns}; where moss-serve up runs the stack on a CPU, one a core; 0: none)",
        type=count, show_default=False)
    admit_burst_window: float = option(HeadroomRule.burst_window, "--admission headroom: seconds after a turn arrives "
                                                                  "at an idle stack that its burst may still arrive",
                                       type=seconds)
    admit_low_slack: float = option(HeadroomRule.low_slack, "--admission headroom: seconds before their listeners run "
                                                            "out below which the lowest 2 percent of the chunks mean too "
                                                            "many turns", type=seconds)
    admit_high_slack: float | None = option(
        None, "--admission headroom: seconds before their listeners run out above which the lowest 2 percent of the "
              "chunks mean room for more turns (default: 0.1, or twice --admit-low-slack if more)", type=seconds,
        show_default=False)
    admit_ttfa: float = option(HeadroomRule.ttfa_target, "--admission headroom: TTFA p95 of the latest turns above "
                                                         "which there are too many turns (a margin under a 300 ms "
                                                         "promise: a 2 s window holds a few dozen turns)",
                               type=positive(float))
    admit_growth: float = option(HeadroomRule.growth, "--admission headroom: with room, the limit also grows each half "
                                                      "second by this share of itself times how far the latest turns' "
                                                      "TTFA p95 is under --admit-ttfa, if that is more than 2 turns (0: "
                                                      "2 turns only; 0.4 paid on an H100 only for stages with room to "
                                                      "grow into, such as --flow-steps 5 --quantization fp8: docs/running.md)",
                                 type=share)
    max_turns_per_client: int | None = option(
        None, "turns one client may have running or waiting at once, each API key its own; without a key, each client "
              "address, but this host's own (loopback: a local proxy, the bench) not at all, and clients behind one "
              "proxy or NAT share its address; beyond: RESOURCE_EXHAUSTED with a retry hint (default: half of "
              f"--max-turns per key, 1/{ADDRESS_SHARE} per address; 0: none)", type=count, show_default=False)
    client_stall_seconds: float = option(10.0, "a streaming call whose client takes no message for this long (it stopped "
                                               "reading) ends CANCELLED, freeing its place and its stages (0: never)",
                                         type=seconds)
    http_request_seconds: float = option(15.0, "the HTTP door: seconds a connection has to send a request's headers "
                                               "(from its opening, or its last response's end), and a speech "
                                               "request's body again; slower ones are closed (slowloris)",
                                         type=positive(float))
    allowed_origins: str | None = option(None, "the WebSocket: origins of web pages (scheme://host[:port], "
                                               "comma-separated; '*': any) that may open sessions besides the "
                                               "gateway's own page (a browser's WebSocket from any other is refused "
                                               "403; clients that are not browsers send no Origin)")
    max_message_bytes: int = option(1 << 20, "largest request message taken, in bytes (a request is text and a few "
                                             "fields); larger: RESOURCE_EXHAUSTED, but a Converse audio message "
                                             "fails its spoken turn only, the session going on (up to 4 times the "
                                             "limit; beyond that gRPC ends the call)", type=positive(int))
    max_streams_per_connection: int = option(256, "calls one client connection may have open at once; more wait on "
                                                  "the client's side (in a burst over it, a few may be refused "
                                                  "UNAVAILABLE: never started, safe to retry)", type=positive(int))
    session_idle_seconds: float = option(300.0, "a Converse session with no message from its client and no turn "
                                                "running for this long ends", type=positive(float))
    voice_owners: str | None = option(None, "a JSON file the gateway keeps each voice made through the API's owner "
                                            "in (its API key's digest), so that after a restart one key's voices stay "
                                            "its own (without it: kept in memory; moss-serve up gives one)")
    max_voices_per_key: int = option(8, "voices one API key may have made through the API at once (the vocoders' "
                                        "--max-voices holds for all of them together); 0: no limit of its own",
                                     type=count)
    max_new_tokens: int = 2048
    default_timeout: float = 120.0
    tls: ServerTls | None = None          # TLS for clients
    backend_tls: ChannelTls | None = None  # TLS (mutual, with a certificate) to llm and vocoder

    def origins(self) -> tuple[str, ...]:
        return tuple(o.strip() for o in (self.allowed_origins or "").split(",") if o.strip())

    def turns_at_once(self) -> int:
        """--max-turns, or the gateway's own default where none was given (`up` on a GPU gives one)."""
        return self.max_turns or DEFAULT_MAX_TURNS
