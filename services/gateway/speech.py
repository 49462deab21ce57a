"""One Synthesize turn as every door runs it (gRPC's Synthesize; HTTP's /v1/audio/speech, http_server.py): a place
from admission (or RESOURCE_EXHAUSTED with a retry hint), a Turn through the stages (pipeline.py), and the
turns-in-progress gauge. The doors differ only in how they read the request and write what it yields."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from moss.speech.v1 import gateway_pb2

from services.gateway import metrics
from services.gateway.admission import Admission
from services.gateway.backends import Backends
from services.gateway.pipeline import Turn
from services.gateway.turn_request import TurnLimits
from services.gateway.voice_owners import owner_of


class Speech:
    def __init__(self, backends: Backends, limits: TurnLimits, admission: Admission):
        self.backends, self.limits, self.admission = backends, limits, admission

    async def synthesize(self, request: gateway_pb2.SynthesizeRequest, client: str | None,
                         time_left: Callable[[], float | None], protocol: str):
        """→ Synthesize's messages: the stream's metadata, its audio chunks, the summary. client: who asks (the
        per-client limit's key: admission.client_id); time_left(): seconds to the caller's deadline (None: the
        gateway's default); protocol: the door, for the metrics. Closed early (the caller left), the turn stops in
        every stage."""
        # waits for a place, or RESOURCE_EXHAUSTED
        async with self.admission.turn(time_left(), client) as place:
            metrics.ACTIVE.inc()
            try:
                turn = Turn(request, self.backends, self.limits, time_left(), headroom=self.admission.headroom,
                            place=place, protocol=protocol, owner=owner_of(client))
                async with contextlib.aclosing(turn.run()) as replies:
                    async for msg in replies:
                        yield msg
            finally:
                metrics.ACTIVE.dec()
