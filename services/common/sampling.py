"""Sampling and chunking settings: service defaults, and validation of what a client sends.

Messages from the wire (moss.speech.v1.SamplingParams / ChunkPolicy) are read field by field; an
unset optional field takes the default. Every refusal names the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import InvalidArgument

MAX_CHUNK_TOKENS = 256
MAX_LOOKAHEAD_FRAMES = 64
PLAYBACK_SPEEDS = (0.25, 4.0)  # OpenAI's range of `speed`


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    repetition_penalty: float = 1.1
    max_new_tokens: int = 500
    min_new_tokens: int = 10  # eosp suppressed before this many generated positions (upstream: 10)
    seed: int | None = None


@dataclass(frozen=True)
class ChunkSettings:
    # The codec decoder's first audio window: a first block of 5 tokens and the 3 its encoder reads ahead
    # (services/vocoder/codec/decoder.py; more for a voice whose prompt is not whole blocks). A smaller first chunk
    # makes no audio and costs the stream a vocoder call before the one that does: under load on an H100, 8
    # against 4 took TTFA p50 at 48 streams from 342-374 to 241 ms, p95 from 437-501 to 321 ms, and none at one
    # stream (docs/benchmarks.md). Its audio less the vocoder's look-ahead (320 ms) is the buffer the
    # second chunk must arrive in.
    first_chunk_tokens: int = 8
    # The second chunk, and where the doubling starts: the codec decoder's block of 5 tokens, all that it needs for
    # its next 400 ms of audio after the first window. It must reach the listener while the first chunk plays (320
    # ms): on an H100 at 128 streams almost every stall was at the second or third chunk (docs/benchmarks.md, issue
    # 20); 5 tokens wait 3 fewer llm steps than 8, and 8, 5, 10, 20 ends every chunk on a block and its look-ahead.
    second_chunk_tokens: int = 5
    # The largest later chunk (8, 5, 10, 20, 20, ...: sequence.py says why): 1.6 s, fewer and cheaper
    # vocoder calls once audio is flowing. 20 tokens with the vocoder's context (30 + 4 frames) is a
    # 114-frame window, inside its 128-frame graph bucket (services/vocoder/runner.py).
    chunk_tokens: int = 20
    lookahead_frames: int | None = None  # the vocoder's; None: its default (ChunkPolicy in common.proto)
    playback_speed: float = 1.0  # how much faster than made the listener plays (HTTP's `speed`): pacing's clock


def _get(msg, name):
    return getattr(msg, name) if msg is not None and msg.HasField(name) else None


def _check(ok: bool, field: str, problem: str) -> None:
    if not ok:
        raise InvalidArgument(field, problem)


def resolve_sampling(msg, max_new_tokens_limit: int, prefix: str = "sampling") -> SamplingSettings:
    d = SamplingSettings()
    t = _get(msg, "temperature")
    p = _get(msg, "top_p")
    k = _get(msg, "top_k")
    rp = _get(msg, "repetition_penalty")
    mx = _get(msg, "max_new_tokens")
    mn = _get(msg, "min_new_tokens")
    seed = _get(msg, "seed")
    if t is not None:
        _check(0.0 <= t <= 2.0, f"{prefix}.temperature", f"must be in [0, 2] (0 is greedy), got {t:g}")
    if p is not None:
        _check(0.0 < p <= 1.0, f"{prefix}.top_p", f"must be in (0, 1], got {p:g}")
    if k is not None:
        _check(k >= 0, f"{prefix}.top_k", f"must be >= 0 (0 disables it), got {k}")
    if rp is not None:
        _check(0.0 < rp <= 10.0, f"{prefix}.repetition_penalty", f"must be in (0, 10], got {rp:g}")
    if mx is not None:
        _check(1 <= mx <= max_new_tokens_limit, f"{prefix}.max_new_tokens",
               f"must be in [1, {max_new_tokens_limit}], got {mx}")
    max_new = mx if mx is not None else min(d.max_new_tokens, max_new_tokens_limit)
    if mn is not None:
        _check(0 <= mn <= max_new, f"{prefix}.min_new_tokens", f"must be in [0, max_new_tokens={max_new}], got {mn}")
    return SamplingSettings(
        temperature=d.temperature if t is None else float(t),
        top_p=d.top_p if p is None else float(p),
        top_k=d.top_k if k is None else int(k),
        repetition_penalty=d.repetition_penalty if rp is None else float(rp),
        max_new_tokens=max_new,
        min_new_tokens=min(d.min_new_tokens, max_new) if mn is None else int(mn),
        seed=seed,
    )


def resolve_chunking(msg, prefix: str = "chunking") -> ChunkSettings:
    d = ChunkSettings()
    first = _get(msg, "first_chunk_tokens")
    second = _get(msg, "second_chunk_tokens")
    later = _get(msg, "chunk_tokens")
    for name, value in (("first_chunk_tokens", first), ("second_chunk_tokens", second), ("chunk_tokens", later)):
        if value is not None:
            _check(1 <= value <= MAX_CHUNK_TOKENS, f"{prefix}.{name}", f"must be in [1, {MAX_CHUNK_TOKENS}], got {value}")
    return ChunkSettings(
        first_chunk_tokens=d.first_chunk_tokens if first is None else first,
        second_chunk_tokens=d.second_chunk_tokens if second is None else second,
        chunk_tokens=d.chunk_tokens if later is None else later,
        lookahead_frames=resolve_lookahead(msg, prefix),
        playback_speed=resolve_playback_speed(msg, prefix),
    )


def resolve_lookahead(msg, prefix: str) -> int | None:
    """A message's optional lookahead_frames, checked: [0, MAX_LOOKAHEAD_FRAMES] or None (the default)."""
    value = _get(msg, "lookahead_frames")
    if value is not None:
        _check(0 <= value <= MAX_LOOKAHEAD_FRAMES, f"{prefix}.lookahead_frames",
               f"must be in [0, {MAX_LOOKAHEAD_FRAMES}], got {value}")
    return value


def resolve_playback_speed(msg, prefix: str) -> float:
    """A message's optional playback_speed, checked: in PLAYBACK_SPEEDS, or ChunkSettings' default when unset."""
    value = _get(msg, "playback_speed")
    if value is None:
        return ChunkSettings.playback_speed
    _check(PLAYBACK_SPEEDS[0] <= value <= PLAYBACK_SPEEDS[1], f"{prefix}.playback_speed",
           f"must be in [{PLAYBACK_SPEEDS[0]}, {PLAYBACK_SPEEDS[1]}], got {value:g}")
    return float(value)


def sampling_to_fields(s: SamplingSettings) -> dict:
    """Settings → keyword arguments for a SamplingParams message (every field set)."""
    fields = {k: getattr(s, k) for k in ("temperature", "top_p", "top_k", "repetition_penalty", "max_new_tokens", "min_new_tokens")}
    if s.seed is not None:
        fields["seed"] = s.seed
    return fields
