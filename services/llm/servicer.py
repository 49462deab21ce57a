"""moss.speech.v1.Llm: translate messages to engine requests and chunks back. Logic lives in the engine."""

from __future__ import annotations

import uuid

from moss.speech.v1 import llm_pb2, llm_pb2_grpc

from services.common.errors import InvalidArgument
from services.common.sampling import resolve_chunking, resolve_sampling
from services.llm import metrics
from services.llm.async_engine import AsyncEngine
from services.llm.engine.engine import GenerationRequest
from services.llm.sequence import Chunk


def to_request(req: llm_pb2.GenerateRequest, max_new_tokens_limit: int) -> GenerationRequest:
    turn = req.WhichOneof("turn")
    if turn is None:
        raise InvalidArgument("turn", "set text, audio or tokens")
    if req.output_mode not in llm_pb2.OutputMode.values():
        raise InvalidArgument("output_mode", f"unknown value {req.output_mode}")
    return GenerationRequest(
        request_id=req.request_id or uuid.uuid4().hex,
        sampling=resolve_sampling(req.sampling if req.HasField("sampling") else None, max_new_tokens_limit),
        chunking=resolve_chunking(req.chunking if req.HasField("chunking") else None),
        text=req.text if turn == "text" else None,
        user_codes=list(req.audio.codes) if turn == "audio" else None,
        text_ids=list(req.tokens.text) if turn == "tokens" else None,
        audio_ids=list(req.tokens.audio) if turn == "tokens" else None,
        system_prompt=req.system_prompt,
        audio_reply=req.output_mode != llm_pb2.OUTPUT_MODE_TEXT,
        session_id=req.session_id,
        history_text_ids=list(req.history.text) if req.HasField("history") else None,
        history_audio_ids=list(req.history.audio) if req.HasField("history") else None,
    )


class TextStream:
    """A request's text tokens → the text they add, chunk by chunk. Decodes everything so far and sends what
    is new; a trailing incomplete UTF-8 sequence (U+FFFD) waits for the bytes that complete it."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.sent = tokenizer, [], 0

    def add(self, ids: list[int], final: bool) -> str:
        if not ids and not final:
            return ""
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        end = len(text) if final else len(text.rstrip("\ufffd"))
        piece, self.sent = text[self.sent : end], max(self.sent, end)
        return piece


def to_response(chunk: Chunk, text: str = "") -> llm_pb2.GenerateResponse:
    msg = llm_pb2.GenerateResponse(
        index=chunk.index, first=chunk.first, final=chunk.final,
        audio_tokens=chunk.audio_tokens, text_tokens=chunk.text_tokens, text=text,
        since_arrival_seconds=chunk.since_arrival,
    )
    if chunk.stats is not None:
        s = chunk.stats
        msg.stats.CopyFrom(llm_pb2.GenerationStats(
            prompt_tokens=s.prompt_tokens, generated_tokens=s.generated_tokens, audio_tokens=s.audio_tokens,
            text_tokens=s.text_tokens, queue_seconds=s.queue_seconds, prefill_seconds=s.prefill_seconds,
            decode_seconds=s.decode_seconds, first_audio_token_seconds=s.first_audio_token_seconds,
            finish_reason=int(s.finish_reason),
        ))
    if chunk.turn_tokens is not None:
        msg.turn_tokens.CopyFrom(llm_pb2.PromptTokens(text=chunk.turn_tokens[0], audio=chunk.turn_tokens[1]))
    return msg


class LlmServicer(llm_pb2_grpc.LlmServicer):
    def __init__(self, engine: AsyncEngine):
        self.engine = engine

    async def Generate(self, request, context):
        gen_request = to_request(request, self.engine.engine.config.max_new_tokens_limit)
        seq = self.engine.engine.make_sequence(gen_request)
        text = TextStream(self.engine.engine.tokenizer)
        async for chunk in self.engine.generate(seq):
            metrics.observe_chunk(chunk)
            yield to_response(chunk, text.add(chunk.text_tokens, chunk.final))

    async def ReleaseSession(self, request, context):
        if not request.session_id:
            raise InvalidArgument("session_id", "must not be empty")
        return llm_pb2.ReleaseSessionResponse(released=await self.engine.release_session(request.session_id))

    async def Hold(self, request, context):
        if not request.request_id:
            raise InvalidArgument("request_id", "must not be empty")
        return llm_pb2.HoldResponse(found=await self.engine.hold(request.request_id, request.held))
