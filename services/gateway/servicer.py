"""moss.speech.v1.Gateway: the public API. A Synthesize call is one turn, as every door runs it (speech.py); a
Converse call is a Conversation of turns (conversation.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import grpc
from moss.speech.v1 import gateway_pb2_grpc

from services.gateway.admission import client_of
from services.gateway.conversation import Conversation
from services.gateway.speech import Speech

# The gateway answers this long before a caller's deadline: a turn's waits and its backend calls end that much
# earlier, so its status (the stage not ready, or the one that ran out of time) reaches the caller before the caller's
# own clock ends the call. Without it the two end at the same instant: the caller reads a bare DEADLINE_EXCEEDED, and
# grpc logs an ExecuteBatchError for the status sent on a call already over.
ANSWER_MARGIN_SECONDS = 0.2


def time_to_answer(context: grpc.aio.ServicerContext) -> Callable[[], float | None]:
    """→ time_left() for a turn: seconds to the caller's deadline less ANSWER_MARGIN_SECONDS (None: no deadline)."""
    def left() -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None else remaining - ANSWER_MARGIN_SECONDS
    return left


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, speech: Speech, session_idle_seconds: float):
        self.speech, self.session_idle_seconds = speech, session_idle_seconds

    async def Synthesize(self, request, context):
        # closed at once when the call ends early (the client left, or stopped reading): its stages with it
        turn = self.speech.synthesize(request, client_of(context), time_to_answer(context), "grpc")
        async with contextlib.aclosing(turn) as replies:
            async for msg in replies:
                yield msg

    async def Converse(self, request_iterator, context):
        s = self.speech
        conversation = Conversation(s.backends, s.limits, s.admission, self.session_idle_seconds, client_of(context),
                                    time_to_answer(context))
        async with contextlib.aclosing(conversation.run(request_iterator)) as replies:
            async for msg in replies:
                yield msg
