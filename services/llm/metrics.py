"""Every metric the llm service exports (docs/architecture.md §6: names and buckets)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import COUNT_BUCKETS, LATENCY_BUCKETS
from services.llm.engine.stats import EngineLoad, StepStats
from services.llm.sequence import Chunk

QUEUE_WAIT = Histogram("llm_queue_wait_seconds", "Request arrival to first scheduled", buckets=LATENCY_BUCKETS)
PREFILL = Histogram("llm_prefill_seconds", "First scheduled to first token sampled (prompt processing)", buckets=LATENCY_BUCKETS)
FIRST_AUDIO_TOKEN = Histogram(
    "llm_time_to_first_audio_token_seconds", "Request arrival to first audio code sampled", buckets=LATENCY_BUCKETS
)
INTER_TOKEN = Histogram("llm_inter_token_seconds", "Time between a request's consecutive tokens", buckets=LATENCY_BUCKETS)
STEP = Histogram("llm_step_seconds", "Duration of one engine step", buckets=LATENCY_BUCKETS)
BATCH_SIZE = Histogram("llm_batch_size", "Sequences in one engine step", buckets=COUNT_BUCKETS)
TOKENS_PER_CHUNK = Histogram("llm_tokens_per_chunk", "Audio tokens in one streamed chunk", buckets=COUNT_BUCKETS)
RUNNING = Gauge("llm_requests_running", "Requests in the running batch (held ones are not)")
WAITING = Gauge("llm_requests_waiting", "Requests waiting to be scheduled (released holds waiting for a running place too)")
KV_USED = Gauge("llm_kv_blocks_used", "KV-cache blocks in use")
KV_FREE = Gauge("llm_kv_blocks_free", "KV-cache blocks free")
HELD = Gauge("llm_requests_held", "Requests held: their listeners stopped taking audio (Llm.Hold); they take no running place")
SESSIONS = Gauge("llm_sessions", "Sessions whose last finished turn's KV blocks are pinned for their next turn")
PREFILL_TOKENS = Counter("llm_prefill_tokens_total", "Prompt (or recomputed) positions computed")
PREFIX_HIT_TOKENS = Counter("llm_prefix_cache_hit_tokens_total", "Prompt positions served from cached KV blocks")
PREFIX_QUERIED_TOKENS = Counter("llm_prefix_cache_queried_tokens_total", "Prompt positions looked up in the prefix cache")
PREEMPTIONS = Counter("llm_preemptions_total", "Running requests preempted for want of KV blocks (recomputed later)")
GENERATED = Counter("llm_generated_tokens_total", "Tokens streamed, by channel", ["channel"])
PACED = Counter("llm_paced_seconds_total", "Time steps were held: every stream had --max-audio-lead seconds of audio ahead")
GPU_PLACE_STEPS = Counter("llm_gpu_place_steps_total", "Steps by where they ran with --busy-share: the whole GPU, or the "
                          "llm's share of its multiprocessors while the stack is busy", ["place"])
REQUESTS = Counter("llm_requests_total", "Finished Generate calls, by gRPC status code", ["code"])


def observe_step(s: StepStats) -> None:
    STEP.observe(s.duration)
    BATCH_SIZE.observe(s.batch_size)
    for d in s.prefill_durations:
        PREFILL.observe(d)
    for d in s.token_intervals:
        INTER_TOKEN.observe(d)
    PREFILL_TOKENS.inc(s.prefill_tokens)
    PREFIX_HIT_TOKENS.inc(s.prefix_hit_tokens)
    PREFIX_QUERIED_TOKENS.inc(s.prefix_queried_tokens)
    PREEMPTIONS.inc(s.preemptions)
    if s.place:
        GPU_PLACE_STEPS.labels(s.place).inc()


def observe_hold(seconds: float) -> None:
    PACED.inc(seconds)


def observe_load(load: EngineLoad) -> None:
    RUNNING.set(load.running)
    WAITING.set(load.waiting)
    KV_USED.set(load.blocks_used)
    KV_FREE.set(load.blocks_free)
    SESSIONS.set(load.sessions)
    HELD.set(load.held)


def observe_chunk(chunk: Chunk) -> None:
    TOKENS_PER_CHUNK.observe(len(chunk.audio_tokens))
    GENERATED.labels("audio").inc(len(chunk.audio_tokens))
    GENERATED.labels("text").inc(len(chunk.text_tokens))
    if chunk.stats is not None:
        QUEUE_WAIT.observe(chunk.stats.queue_seconds)
        if chunk.stats.audio_tokens:
            FIRST_AUDIO_TOKEN.observe(chunk.stats.first_audio_token_seconds)


def observe_request(method: str, code: str) -> None:
    REQUESTS.labels(code).inc()
