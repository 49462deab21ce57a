"""Every metric the gateway exports (docs/architecture.md §6: names and buckets)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS, RATIO_BUCKETS

# `protocol`: the door a turn came through: grpc, http (/v1/audio/speech) or websocket (a dashboard sums them, or
# splits by it).
PROTOCOLS = ("grpc", "http", "websocket")
TTFA = Histogram("gateway_ttfa_seconds", "Turn received to first PCM bytes sent", ["protocol"], buckets=LATENCY_BUCKETS)
SPEECH_END_TO_FIRST_AUDIO = Histogram(
    "gateway_speech_end_to_first_audio_seconds", "A spoken turn: the end of the user's speech (EndOfSpeech received, or "
    "the speech's end detected) to the reply's first PCM bytes sent", buckets=LATENCY_BUCKETS)
SPOKEN_TURNS = Counter("gateway_spoken_turns_total", "Spoken user turns encoded (their replies follow)")
VOICE_CREATE = Histogram("gateway_voice_create_seconds", "A voice made through the API (CreateVoice, POST "
                         "/v1/audio/voices): its recording in to the voice on every vocoder replica",
                         buckets=LATENCY_BUCKETS)
VOICES_DELETED = Counter("gateway_voices_deleted_total", "Voices deleted through the API")
VOICE_BARGE_INS = Counter("gateway_voice_barge_ins_total", "Turns cancelled because the user started to speak "
                          "(detect_speech)")
REQUEST = Histogram("gateway_request_seconds", "Turn received to last PCM bytes sent", ["protocol"],
                    buckets=LATENCY_BUCKETS)
LLM_FIRST_CHUNK = Histogram(
    "gateway_llm_first_chunk_seconds", "Turn received to the llm's first token chunk at the gateway", buckets=LATENCY_BUCKETS
)
VOCODER_FIRST_PCM = Histogram(
    "gateway_vocoder_first_pcm_seconds", "First tokens sent to the vocoder to its first PCM at the gateway", buckets=LATENCY_BUCKETS
)
RTF = Histogram("gateway_real_time_factor", "Turn wall time over the duration of the audio produced", buckets=RATIO_BUCKETS)
# Stalls (docs/architecture.md §5) on the playback clock of a listener who starts at the first PCM the gateway sends.
STALL = Histogram("gateway_stall_seconds", "How late each stalled chunk was sent (past the listener's playback clock, "
                  "beyond 20 ms of jitter)", ["protocol"], buckets=LATENCY_BUCKETS)
# Slack: how early a playing stream's chunk was sent before its listener would have run out (< 0: late). Headroom
# shrinks here before any stall; --admission headroom reads the same figure (headroom.py).
SLACK_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0)
SLACK = Histogram("gateway_playback_slack_seconds", "How early each chunk of a playing stream was sent before its "
                  "listener would have run out of audio (le=0: late)", buckets=SLACK_BUCKETS)
# The second audio chunk's slack alone: its listener waits for it with the first chunk's audio only, and under load it is
# the chunk whose slack the admission limit falls on (docs/admission.md, docs/benchmarks.md 2026-12-01).
SECOND_CHUNK_SLACK = Histogram("gateway_second_chunk_slack_seconds", "How early each turn's second audio chunk was sent "
                               "before its listener would have run out of audio (le=0: late)", buckets=SLACK_BUCKETS)
STALLED_TURNS = Counter("gateway_stalled_turns_total", "Turns with at least one stall", ["protocol"])
AUDIO_TURNS = Counter("gateway_audio_turns_total", "Turns that sent audio (the base of the stall-free share)", ["protocol"])
for _protocol in PROTOCOLS:  # exported from the start, at 0
    for _metric in (TTFA, REQUEST, STALL, STALLED_TURNS, AUDIO_TURNS):
        _metric.labels(_protocol)
ACTIVE = Gauge("gateway_active_requests", "Turns in progress (Synthesize calls and Converse turns)")
SESSIONS = Gauge("gateway_active_sessions", "Converse sessions open")
SESSIONS_ENDED = Counter("gateway_sessions_ended_total", "Converse sessions ended, by how: closed, client_done (half-close), "
                         "idle, or aborted (an error, or the client left)", ["reason"])
for _reason in ("closed", "client_done", "idle", "aborted"):  # exported from the start, at 0
    SESSIONS_ENDED.labels(_reason)
TURN_FAILURES = Counter("gateway_turn_failures_total", "Converse turns that failed while their session went on "
                        "(TurnFailed), by gRPC code", ["code"])
for _code in ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL"):  # the usual ones, exported from the start at 0
    TURN_FAILURES.labels(_code)
CANCELS = Counter("gateway_turn_cancels_total", "Converse turns cancelled while running (barge-in)")
CANCEL = Histogram("gateway_turn_cancel_seconds", "Cancel received to the turn stopped in every stage",
                   buckets=LATENCY_BUCKETS)
ADMISSIONS_REFUSED = Counter("gateway_admissions_refused_total", "Turns refused RESOURCE_EXHAUSTED: every place "
                             "and every queue slot taken")
ADMISSIONS_REFUSED_CLIENT = Counter("gateway_client_admissions_refused_total", "Turns refused RESOURCE_EXHAUSTED because "
                                    "their client (API key, or address) had --max-turns-per-client running or waiting")
STALLED_CALLS = Counter("gateway_stalled_calls_total", "Calls ended (CANCELLED) because their client took no message "
                        "for --client-stall-seconds: it stopped reading", ["method"])
for _method in ("Synthesize", "Converse", "speech", "websocket"):  # exported from the start, at 0 (HTTP's: the last two)
    STALLED_CALLS.labels(_method)
CLIENT_HOLDS = Counter("gateway_client_holds_total", "Times a turn stopped feeding its vocoder because its client had "
                       "not taken its last audio for 0.5 s (it resumes when the client does)")
HEADROOM_LIMIT = Gauge("gateway_admission_limit", "Turns the stages serve in time at once, as --admission headroom has "
                       "learned it (with --admission count: --max-turns)")
HEADROOM_REFUSED = Counter("gateway_headroom_refusals_total", "Turns refused RESOURCE_EXHAUSTED by --admission "
                           "headroom: as many turns ran as the stages serve in time")
BURST_ADMITTED = Counter("gateway_burst_admissions_total", "Turns --admission headroom let in over its limit, as part "
                         "of a burst on an idle stack, or as an ongoing session's next turn while one drains "
                         "(--admit-burst-turns)")
START_WAIT = Histogram("gateway_start_wait_seconds", "How long admitted turns waited to start while "
                       "--max-starting-turns turns were starting (prefill, first audio)", buckets=LATENCY_BUCKETS)
QUEUED_TURNS = Gauge("gateway_queued_turns", "Turns waiting for a place (admission control)")
ADMISSION_WAIT = Histogram("gateway_admission_wait_seconds", "How long turns waited for a place (turns admitted at "
                           "once are not counted)", buckets=LATENCY_BUCKETS)
BACKEND_READY = Gauge("gateway_backend_ready", "1 while a replica of the backend (llm, vocoder) answers its health "
                      "check SERVING, else 0", ["backend"])
# Replicas: `target` is a configured address (a handful per gateway).
REPLICA_READY = Gauge("gateway_replica_ready", "1 while this replica answers its health check SERVING and no call has "
                      "found it unreachable since, else 0 (it gets no new calls)", ["backend", "target"])
REPLICA_CALLS = Gauge("gateway_replica_calls", "Calls in progress on this replica: turns on an llm, streams on a vocoder",
                      ["backend", "target"])
REPLICA_SESSIONS = Gauge("gateway_replica_sessions", "Converse sessions placed on this llm replica", ["target"])
REPLICA_RETRIES = Counter("gateway_replica_retries_total", "Calls started again on another replica (or the same one, "
                          "back) because theirs failed before answering", ["backend"])
SESSION_MOVES = Counter("gateway_session_moves_total", "Converse sessions moved to another llm replica because theirs "
                        "was not ready (the new one is given the session's history)")
READY_WAIT = Histogram("gateway_ready_wait_seconds", "How long turns waited for a backend that was not ready "
                       "(turns that found both ready are not counted)", buckets=LATENCY_BUCKETS)
REQUESTS = Counter("gateway_requests_total", "Finished calls, by gRPC status code", ["code"])
HTTP_REQUESTS = Counter("gateway_http_requests_total", "Finished HTTP requests, by route and HTTP status (499: cut "
                        "short by its client)", ["route", "status"])
HTTP_MALFORMED = Counter("gateway_http_malformed_requests_total", "HTTP requests the parser refused (a bad request "
                         "line, header or encoding): answered 400 and the connection closed")
HTTP_REQUESTS.labels("/v1/audio/speech", "200")  # exported from the start, at 0


_REQUESTS_BY_CODE: dict[str, object] = {}  # REQUESTS' child per code: labels() is a lookup under a lock, per call


def observe_request(method: str, code: str) -> None:
    child = _REQUESTS_BY_CODE.get(code)
    if child is None:
        child = _REQUESTS_BY_CODE[code] = REQUESTS.labels(code)
    child.inc()


def observe_stalled(method: str) -> None:
    STALLED_CALLS.labels(method).inc()
