"""What a turn asks of the stages, checked before any stage is called: the client's request (or a session's spoken
turn) → the llm's GenerateRequest and the audio format (pipeline.py runs it)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from moss.speech.v1 import common_pb2, gateway_pb2, llm_pb2

from services.common.audio import resolve_format
from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.sampling import resolve_chunking, resolve_sampling, sampling_to_fields
from services.gateway.session import Session


@dataclass(frozen=True)
class Spoken:
    """A spoken turn's input: the user's codes (the encoder's) and when the speech ended (time.perf_counter(): the
    turn's clock starts there)."""

    codes: list[int]
    ended_at: float
    encoder_finish_seconds: float = 0.0
    audio_seconds: float = 0.0


# gRPC's transport takes messages up to this many times --max-message-bytes, so that one over the limit is the
# gateway's to answer (a spoken turn's audio: that turn fails, the session goes on) instead of gRPC's (the call ends)
TRANSPORT_SLACK = 4


@dataclass(frozen=True)
class TurnLimits:
    max_text_chars: int = 2000
    max_new_tokens: int = 2048
    default_timeout: float = 120.0  # seconds, when the client sets no deadline
    max_message_bytes: int = 1 << 20  # a request message, at most (--max-message-bytes)


def check_size(message, limits: TurnLimits, what: str = "request", size: int | None = None) -> None:
    """ResourceExhausted for a message over --max-message-bytes, as gRPC itself would say, with the sizes (size: the
    message's, where the caller has it already)."""
    if (size := message.ByteSize() if size is None else size) > limits.max_message_bytes:
        raise ResourceExhausted(f"{what}: {size} bytes is over the limit of {limits.max_message_bytes} "
                                "(--max-message-bytes)")


def validate_text(text: str, limits: TurnLimits, field: str = "text") -> None:
    if not text.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(text) > limits.max_text_chars:
        raise InvalidArgument(field, f"{len(text)} characters is over the limit of {limits.max_text_chars}")


def validate(req: gateway_pb2.SynthesizeRequest, limits: TurnLimits, session: Session | None = None,
             spoken: Spoken | None = None, text_reply: bool = False) -> tuple[llm_pb2.GenerateRequest, int]:
    """Everything a client can get wrong is refused here, before any stage is called.
    session: the turn continues that session (its system prompt replaces the voice's). spoken: the user's turn is
    these codes, not req.text. text_reply: the reply is text alone.
    → (the llm request, the resolved audio format)."""
    check_size(req, limits)
    if spoken is None:
        validate_text(req.text, limits)
    user = {"audio": llm_pb2.SpokenTurn(codes=spoken.codes)} if spoken is not None else {"text": req.text}
    fmt = resolve_format(req.format, "format")
    sampling = resolve_sampling(req.sampling if req.HasField("sampling") else None, limits.max_new_tokens)
    chunking = resolve_chunking(req.chunking if req.HasField("chunking") else None)
    return llm_pb2.GenerateRequest(
        request_id=uuid.uuid4().hex,
        session_id=session.session_id if session else "",
        history=session.request_history() if session else None,
        **user,
        system_prompt=session.system_prompt if session else "",
        sampling=common_pb2.SamplingParams(**sampling_to_fields(sampling)),
        chunking=common_pb2.ChunkPolicy(first_chunk_tokens=chunking.first_chunk_tokens,
                                        second_chunk_tokens=chunking.second_chunk_tokens, chunk_tokens=chunking.chunk_tokens,
                                        lookahead_frames=chunking.lookahead_frames,
                                        playback_speed=chunking.playback_speed),
        output_mode=llm_pb2.OUTPUT_MODE_TEXT if text_reply else llm_pb2.OUTPUT_MODE_AUDIO,
    ), fmt
