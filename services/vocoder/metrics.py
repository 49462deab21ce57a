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
# The first-chunk lane's calls alone (--first-chunk-lane on), counted in the two above too: the playing streams' calls
# are the difference. Under load a stream's second chunk waits for a playing call in flight, then its own
# (docs/admission.md).
LANE_BATCH_SIZE = Histogram("vocoder_lane_batch_size", "Windows vocoded together in one call of the first-chunk lane",
                            buckets=(1, 2, 4, 8, 16, 32, 64, 128))
LANE_BATCH = Histogram("vocoder_lane_batch_seconds", "Duration of one call of the first-chunk lane",
                       buckets=LATENCY_BUCKETS)
# The main worker's calls (all but the first-chunk lane's) by their windows: each class's count and summed seconds give
# its mean call, so that what one more window costs in the stack can be read beside the flow's own calls (larger calls
# would make more audio a call-second by one reading, little more by another: docs/benchmarks.md, 2026-12-02).
CALL_SIZES = ((4, "1-4"), (8, "5-8"), (16, "9-16"), (32, "17-32"), (None, "33+"))
CALL_BY_WINDOWS = Histogram("vocoder_call_seconds_by_windows", "Duration of one call of the vocoder's main worker (not "
                            "the first-chunk lane's), by its windows", ["windows"], buckets=LATENCY_BUCKETS)
for _most, _size in CALL_SIZES:
    CALL_BY_WINDOWS.labels(_size)  # every class from the start: a count of 0 reads as none, not as no data
TOKEN_DECODE = Histogram("vocoder_token_decode_seconds",
                         "One batched pass of the token decoder (tokens to mel, every stream of a model call)",
                         buckets=LATENCY_BUCKETS)
GENERATE = Histogram("vocoder_generate_seconds",
                     "One batched call of the generator (mel to samples, every window of a model call)",
                     buckets=LATENCY_BUCKETS)
AUDIO_SECONDS = Counter("vocoder_audio_seconds_total", "Seconds of audio synthesized")
REQUESTS = Counter("vocoder_requests_total", "Finished Vocode calls, by gRPC status code", ["code"])
NONFINITE_WINDOWS = Counter("vocoder_nonfinite_windows_total", "Windows with NaN or inf, by where it first showed: the "
                            "token decoder's mel, or only the generator's samples (their samples are sent as silence)",
                            ["stage"])
NONFINITE_SAMPLES = Counter("vocoder_nonfinite_samples_total", "NaN or inf samples sent as silence instead")
for _stage in ("mel", "generator"):
    NONFINITE_WINDOWS.labels(_stage)  # both series from the start: a rate of 0 reads as none, not as no data
HISTORY_HELD = Gauge("vocoder_flow_history_streams", "Streams holding a slot of the flow's stream history (their "
                     "frames solved once); the streams beyond its slots are decoded over their window, slower")
HISTORY_SLOTS = Gauge("vocoder_flow_history_slots", "Slots of the flow's stream history (--flow-history-streams)")
GRAPHS_PENDING = Gauge("vocoder_graphs_pending", "CUDA graphs still to capture while serving (--graphs-before-serving); "
                       "until then calls of their shapes are padded into a larger graph, slower")
FLOW_TICK = Histogram("vocoder_flow_tick_seconds", "One tick of the flow's solve (--flow-solve on): an Euler step of "
                      "every row in flight (device time on CUDA)", buckets=LATENCY_BUCKETS)
FLOW_TICK_ROWS = Histogram("vocoder_flow_tick_rows", "Rows in flight at a tick of the flow's solve",
                           buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64))
FLOW_ADMIT = Histogram("vocoder_flow_admit_seconds", "One admission to the flow's solve: the encoder of the rows that "
                       "join it (device time on CUDA)", buckets=LATENCY_BUCKETS)
FLOW_ADMIT_ROWS = Histogram("vocoder_flow_admit_rows", "Rows that join the flow's solve in one admission",
                            buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64))


VOICES = Gauge("vocoder_voices", "Voices the flow decoder holds (its --voices-dir's and those added while serving)")
VOICE_ADD = Histogram("vocoder_voice_add_seconds", "A voice added while serving: its prompt prefix recorded, the "
                      "device held from the workers' calls meanwhile", buckets=LATENCY_BUCKETS)


def watch_voices(vocoder) -> None:
    """The voices the vocoder holds, read when scraped."""
    VOICES.set_function(lambda: len(vocoder.voices))


def observe_voice_add(seconds: float) -> None:
    VOICE_ADD.observe(seconds)


def watch_captures(background) -> None:
    """The CUDA graphs still to capture while serving (capture.py), read when scraped."""
    GRAPHS_PENDING.set_function(lambda: background.pending)


def watch_history(history) -> None:
    """The flow's stream history (codec/history.py), read when scraped."""
    HISTORY_HELD.set_function(lambda: history.held)
    HISTORY_SLOTS.set(history.streams)


def observe_chunk(queue_seconds: float, compute_seconds: float) -> None:
    QUEUE_WAIT.observe(queue_seconds)
    CHUNK.observe(compute_seconds)


def call_size(windows: int) -> str:
    """The class of CALL_SIZES a call of this many windows falls in."""
    return next(size for most, size in CALL_SIZES if most is None or windows <= most)


def _observe_call(size: int, seconds: float) -> None:
    BATCH_SIZE.observe(size)
    BATCH.observe(seconds)


def observe_batch(size: int, seconds: float) -> None:
    """A call of the main worker."""
    _observe_call(size, seconds)
    CALL_BY_WINDOWS.labels(call_size(size)).observe(seconds)


def observe_lane_batch(size: int, seconds: float) -> None:
    """A call of the first-chunk lane."""
    _observe_call(size, seconds)
    LANE_BATCH_SIZE.observe(size)
    LANE_BATCH.observe(seconds)


def observe_token_decode(seconds: float) -> None:
    TOKEN_DECODE.observe(seconds)


def observe_generate(seconds: float) -> None:
    GENERATE.observe(seconds)


def observe_solve(kind: str, rows: int, seconds: float) -> None:
    """An admission ("admit") or a tick ("tick") of the flow's solve."""
    (FLOW_ADMIT if kind == "admit" else FLOW_TICK).observe(seconds)
    (FLOW_ADMIT_ROWS if kind == "admit" else FLOW_TICK_ROWS).observe(rows)


def observe_first_chunk(seconds: float) -> None:
    FIRST_CHUNK.observe(seconds)


def observe_audio(seconds: float) -> None:
    AUDIO_SECONDS.inc(seconds)


def observe_request(method: str, code: str) -> None:
    if method == "Vocode":  # (ListVoices, asked by every gateway as a vocoder becomes ready, is not a request)
        REQUESTS.labels(code).inc()


def observe_nonfinite(stage: str, samples: int) -> None:
    NONFINITE_WINDOWS.labels(stage).inc()
    NONFINITE_SAMPLES.inc(samples)
