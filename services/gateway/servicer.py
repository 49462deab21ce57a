"""moss.speech.v1.Gateway: the public API. A Synthesize call is one Turn (pipeline.py); a Converse call is a
Conversation of turns (conversation.py)."""

from __future__ import annotations

import contextlib

from moss.speech.v1 import gateway_pb2_grpc

from services.gateway import metrics
from services.gateway.admission import Admission, client_of
from services.gateway.backends import Backends
from services.gateway.conversation import Conversation
from services.gateway.pipeline import Turn, TurnLimits


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, backends: Backends, limits: TurnLimits, admission: Admission, session_idle_seconds: float):
        self.backends, self.limits, self.admission = backends, limits, admission
        self.session_idle_seconds = session_idle_seconds

    async def Synthesize(self, request, context):
        # waits for a place, or RESOURCE_EXHAUSTED
        async with self.admission.turn(context.time_remaining(), client_of(context)) as place:
            metrics.ACTIVE.inc()
            try:
                turn = Turn(request, self.backends, self.limits, context.time_remaining(),
                            headroom=self.admission.headroom, place=place)
                # closed at once when the call ends early (the client left, or stopped reading): its stages with it
                async with contextlib.aclosing(turn.run()) as replies:
                    async for msg in replies:
                        yield msg
            finally:
                metrics.ACTIVE.dec()

    async def Converse(self, request_iterator, context):
        conversation = Conversation(self.backends, self.limits, self.admission, self.session_idle_seconds, context)
        async with contextlib.aclosing(conversation.run(request_iterator)) as replies:
            async for msg in replies:
                yield msg
