"""Every metric the encoder service exports (docs/architecture.md §6: names and buckets)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

CALLS = Gauge("encoder_calls", "Encode calls open (listening for speech, or encoding it)")
SPEAKERS = Gauge("encoder_speakers", "Speakers being encoded: each holds one place of the encoder's keys and values")
SPEAKER_PLACES = Gauge("encoder_speaker_places", "Places for speakers (--max-speakers)")
FINISH = Histogram("encoder_finish_seconds", "A turn's end (received, or detected) to its codes ready",
                   buckets=LATENCY_BUCKETS)
BATCH_SIZE = Histogram("encoder_batch_size", "Speakers encoded together in one model call",
                       buckets=(1, 2, 4, 8, 16, 32, 64, 128))
BATCH = Histogram("encoder_batch_seconds", "Duration of one model call (every speaker in it)", buckets=LATENCY_BUCKETS)
VAD_BATCH = Histogram("encoder_vad_batch_seconds", "Duration of one voice-activity call (every listening speaker's "
                      "new windows)", buckets=LATENCY_BUCKETS)
AUDIO_SECONDS = Counter("encoder_audio_seconds_total", "Seconds of speech encoded")
SPEECH = Counter("encoder_speech_total", "Speech detections, by what was found", ["event"])
REQUESTS = Counter("encoder_requests_total", "Finished Encode calls, by gRPC status code", ["code"])
for _event in ("started", "ended"):  # exported from the start, at 0
    SPEECH.labels(_event)
REQUESTS.labels("OK")


def watch_speakers(pool, places: int) -> None:
    """The encoder's keys and values (kv_pool.py), read when scraped: the places speakers hold (a turn's segment encoded
    again at its end borrows places for its call: not a speaker's; bench's sampled peak once read 4 for 2 sessions)."""
    SPEAKERS.set_function(pool.speakers)
    SPEAKER_PLACES.set(places)


def observe_batch(size: int, seconds: float) -> None:
    BATCH_SIZE.observe(size)
    BATCH.observe(seconds)


def observe_vad_batch(size: int, seconds: float) -> None:
    VAD_BATCH.observe(seconds)


def observe_request(method: str, code: str) -> None:
    REQUESTS.labels(code).inc()
