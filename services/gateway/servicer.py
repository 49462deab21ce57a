"""moss.speech.v1.Gateway: the public API. Each call is one Turn (pipeline.py)."""

from __future__ import annotations

from moss.speech.v1 import gateway_pb2_grpc

from services.gateway import metrics
from services.gateway.admission import Admission
from services.gateway.backends import Backends
from services.gateway.pipeline import Turn, TurnLimits


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, backends: Backends, limits: TurnLimits, admission: Admission):
        self.backends, self.limits, self.admission = backends, limits, admission

    async def Synthesize(self, request, context):
        async with self.admission.turn(context.time_remaining()):  # waits for a place, or RESOURCE_EXHAUSTED
            metrics.ACTIVE.inc()
            try:
                async for msg in Turn(request, self.backends, self.limits, context.time_remaining()).run():
                    yield msg
            finally:
                metrics.ACTIVE.dec()
