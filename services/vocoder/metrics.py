"""Every metric the vocoder service exports (docs/architecture.md §6: names and buckets)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

QUEUE_WAIT = Histogram("vocoder_queue_wait_seconds", "Chunk ready to compute started (waiting for the model)", buckets=LATENCY_BUCKETS)
CHUNK = Histogram("vocoder_chunk_seconds", "Compute time of one chunk: tokens to PCM", buckets=LATENCY_BUCKETS)
FIRST_CHUNK = Histogram(
    "vocoder_first_chunk_seconds", "First tokens of a stream received to its first PCM ready", buckets=LATENCY_BUCKETS
)
ACTIVE_STREAMS = Gauge("vocoder_active_streams", "Vocode streams open")
BATCH_SIZE = Histogram("vocoder_batch_size", "Windows vocoded together in one model call",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128))
BATCH = Histogram("vocoder_batch_seconds", "Duration of one model call (all of its windows)", buckets=LATENCY_BUCKETS)
TOKEN_DECODE = Histogram("vocoder_token_decode_seconds",
                         "One batched pass of the token decoder (tokens to mel, every stream of a model call)",
                         buckets=LATENCY_BUCKETS)
GENERATE = Histogram("vocoder_generate_seconds",
                     "One batched call of the generator (mel to samples, every window of a model call)",
                     buckets=LATENCY_BUCKETS)
AUDIO_SECONDS = Counter("vocoder_audio_seconds_total", "Seconds of audio synthesized")
REQUESTS = Counter("vocoder_requests_total", "Finished Vocode calls, by gRPC status code", ["code"])
HISTORY_HELD = Gauge("vocoder_flow_history_streams", "Streams holding a slot of the flow's stream history (their "
                     "frames solved once); the streams beyond its slots are decoded over their window, slower")
HISTORY_SLOTS = Gauge("vocoder_flow_history_slots", "Slots of the flow's stream history (--flow-history-streams)")


def watch_history(history) -> None:
    """The flow's stream history (codec/history.py), read when scraped."""
    HISTORY_HELD.set_function(lambda: history.held)
    HISTORY_SLOTS.set(history.streams)


def observe_chunk(queue_seconds: float, compute_seconds: float) -> None:
    QUEUE_WAIT.observe(queue_seconds)
    CHUNK.observe(compute_seconds)


def observe_batch(size: int, seconds: float) -> None:
    BATCH_SIZE.observe(size)
    BATCH.observe(seconds)


def observe_token_decode(seconds: float) -> None:
    TOKEN_DECODE.observe(seconds)


def observe_generate(seconds: float) -> None:
    GENERATE.observe(seconds)


def observe_first_chunk(seconds: float) -> None:
    FIRST_CHUNK.observe(seconds)


def observe_audio(seconds: float) -> None:
    AUDIO_SECONDS.inc(seconds)


def observe_request(method: str, code: str) -> None:
    if method == "Vocode":  # (ListVoices, asked by every gateway as a vocoder becomes ready, is not a request)
        REQUESTS.labels(code).inc()
