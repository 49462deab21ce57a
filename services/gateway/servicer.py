"""moss.speech.v1.Gateway: the public API. A Synthesize call is one turn, as every door runs it (speech.py); a
Converse call is a Conversation of turns (conversation.py)."""

from __future__ import annotations

import contextlib

from moss.speech.v1 import gateway_pb2_grpc

from services.gateway.admission import client_of
from services.gateway.conversation import Conversation
from services.gateway.speech import Speech


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, speech: Speech, session_idle_seconds: float):
        self.speech, self.session_idle_seconds = speech, session_idle_seconds

    async def Synthesize(self, request, context):
        # closed at once when the call ends early (the client left, or stopped reading): its stages with it
        turn = self.speech.synthesize(request, client_of(context), context.time_remaining, "grpc")
        async with contextlib.aclosing(turn) as replies:
            async for msg in replies:
                yield msg

    async def Converse(self, request_iterator, context):
        s = self.speech
        conversation = Conversation(s.backends, s.limits, s.admission, self.session_idle_seconds, client_of(context),
                                    context.time_remaining)
        async with contextlib.aclosing(conversation.run(request_iterator)) as replies:
            async for msg in replies:
                yield msg
