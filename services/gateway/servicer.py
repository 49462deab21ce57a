"""moss.speech.v1.Gateway: the public API. A Synthesize call is one turn, as every door runs it (speech.py); a
Converse call is a Conversation of turns (conversation.py); CreateVoice, ListVoices and DeleteVoice are the voice
book's (voice_book.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import grpc
from moss.speech.v1 import gateway_pb2, gateway_pb2_grpc

from services.common.audio import BYTES_PER_SAMPLE, resolve_format
from services.common.errors import InvalidArgument
from services.common.recording import LONGEST_RECORDING, RecordingError, check_rate
from services.gateway.admission import client_of
from services.gateway.conversation import Conversation
from services.gateway.speech import Speech
from services.gateway.voice_book import VoiceBook, recording_of_pcm
from services.gateway.voice_owners import owner_of

# The gateway answers this long before a caller's deadline: a turn's waits and its backend calls end that much
# earlier, so its status (the stage not ready, or the one that ran out of time) reaches the caller before the caller's
# own clock ends the call. Without it the two end at the same instant: the caller reads a bare DEADLINE_EXCEEDED, and
# grpc logs an ExecuteBatchError for the status sent on a call already over.
ANSWER_MARGIN_SECONDS = 0.2
VOICE_SECONDS = 60.0  # a voice call without a deadline of its own has this long


def time_to_answer(context: grpc.aio.ServicerContext) -> Callable[[], float | None]:
    """→ time_left() for a turn: seconds to the caller's deadline less ANSWER_MARGIN_SECONDS (None: no deadline)."""
    def left() -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None else remaining - ANSWER_MARGIN_SECONDS
    return left


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, speech: Speech, session_idle_seconds: float, voices: VoiceBook | None = None):
        self.speech, self.session_idle_seconds = speech, session_idle_seconds
        self.voices = voices if voices is not None else VoiceBook(speech.backends, speech.backends.voice_owners)

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

    async def CreateVoice(self, request_iterator, context):
        budget = time_to_answer(context)() or VOICE_SECONDS
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or first.WhichOneof("kind") != "config":
            raise InvalidArgument("config", "the first message of a CreateVoice call must be a config")
        config = first.config
        fmt = resolve_format(config.format, "config.format")
        try:
            check_rate(config.sample_rate)
        except RecordingError as err:
            raise InvalidArgument("config.sample_rate", str(err)) from None
        most = int(LONGEST_RECORDING * config.sample_rate) * BYTES_PER_SAMPLE[fmt]
        pcm = bytearray()
        async for msg in requests:
            if msg.WhichOneof("kind") != "audio":
                raise InvalidArgument("config", "one config, first: then audio only")
            pcm += msg.audio
            if len(pcm) > most:
                raise InvalidArgument("audio", f"the recording is over {LONGEST_RECORDING:g} s; a few seconds of "
                                               "the speaker are enough")
        recording = recording_of_pcm(bytes(pcm), config.sample_rate, fmt)
        return await self.voices.create(config.name, recording, owner_of(client_of(context)), budget)

    async def ListVoices(self, request, context):
        return gateway_pb2.VoiceList(voices=self.voices.listing(owner_of(client_of(context))))

    async def DeleteVoice(self, request, context):
        await self.voices.delete(request.name, owner_of(client_of(context)), time_to_answer(context)() or VOICE_SECONDS)
        return gateway_pb2.DeleteVoiceResponse()
