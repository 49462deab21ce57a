"""A Converse session's cleanup when it is itself cancelled midway: the client may cancel its call the moment the
session has ended (the bench's hands-free sessions do), while the gateway still awaits a turn's cleanup. The user's
open Encode calls must be cancelled before that wait, or each keeps an encoder place for good. Conversation and
Listener run here as the gateway runs them, in front of stand-in stages (no processes)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
from moss.speech.v1 import common_pb2, gateway_pb2

from services.gateway.conversation import Conversation
from services.gateway.turn_request import TurnLimits


class EncodeCall:
    """An Encode call that the encoder keeps open (a place held) until the gateway cancels it."""

    def __init__(self):
        self.cancelled, self.written = False, []

    async def write(self, message) -> None:
        self.written.append(message.WhichOneof("kind"))

    async def done_writing(self) -> None:
        pass

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.Event().wait()  # no reply until cancelled


class Encoder:
    """One encoder replica: its calls, and the calls the gateway counts on it."""

    def __init__(self):
        self.calls: list[EncodeCall] = []
        self.counted = 0
        self.stub = SimpleNamespace(Encode=self.encode)

    def encode(self, timeout=None) -> EncodeCall:
        self.calls.append(EncodeCall())
        return self.calls[-1]

    def add_calls(self, n: int) -> None:
        self.counted += n


class Backends:
    ready_wait, encoder = 1.0, None

    def __init__(self, replica: Encoder):
        self.replica = replica

    def voices(self, owner):
        return None  # not known yet: any voice passes here

    async def acquire_encoder(self, wait: float) -> Encoder:
        return self.replica


def test_a_cleanup_cancelled_at_its_wait_still_cancels_the_users_encode_calls():
    encoder = Encoder()
    pcm = np.zeros(1600, "<i2").tobytes()  # 100 ms at 16 kHz: opens an utterance, as any audio after speech does

    async def scenario():
        conv = Conversation(Backends(encoder), TurnLimits(), admission=None, idle_seconds=60, client=None,
                            time_left=lambda: None)
        close = asyncio.Event()

        async def requests():
            yield gateway_pb2.ConverseRequest(config=gateway_pb2.SessionConfig())
            yield gateway_pb2.ConverseRequest(speech=gateway_pb2.SpeechInput(
                sample_rate=16000, format=common_pb2.AUDIO_FORMAT_PCM16, detect_speech=True))
            yield gateway_pb2.ConverseRequest(audio=gateway_pb2.UserAudio(pcm=pcm))
            await close.wait()
            yield gateway_pb2.ConverseRequest(close=gateway_pb2.CloseSession())
            await asyncio.Event().wait()  # the client's stream stays open

        async def slow_tail():  # an answered turn still closing its vocoder call: 0.3 s once cancelled
            try:
                await asyncio.Event().wait()
            finally:
                await asyncio.sleep(0.3)

        ended = asyncio.Event()

        async def client():
            async for msg in conv.run(requests()):
                if msg.WhichOneof("kind") == "session":
                    conv.tails.add(asyncio.create_task(slow_tail()))
                if msg.WhichOneof("kind") == "ended":
                    ended.set()

        call = asyncio.create_task(client())
        for _ in range(100):  # the audio's utterance is open at the encoder
            if encoder.calls and encoder.calls[0].written == ["config", "audio"]:
                break
            await asyncio.sleep(0.01)
        assert encoder.counted == 1 and not encoder.calls[0].cancelled, encoder.calls
        close.set()
        await asyncio.wait_for(ended.wait(), 5)
        await asyncio.sleep(0.05)  # the gateway now awaits the tail's cleanup
        call.cancel()  # the client gone: gRPC cancels the call's task there
        await asyncio.gather(call, return_exceptions=True)
        await asyncio.sleep(0.01)  # (the reader's cancellation runs)
        # (checked here: asyncio.run cancels every task left once this returns, and would tidy up what leaked)
        assert len(encoder.calls) == 1
        assert encoder.calls[0].cancelled, "the user's Encode call outlived its session: its encoder place is held"
        assert encoder.counted == 0, "the encoder replica still counts the call"

    asyncio.run(scenario())


def test_an_encode_call_whose_reader_never_ran_is_cancelled_too():
    """A listener cancelled before its newest call's reader first ran (the audio that opened it came in the same turn of
    the event loop): the call is cancelled and uncounted all the same."""
    from services.gateway.listener import Callbacks, Listener

    encoder = Encoder()

    async def nothing(*args):
        raise AssertionError("no speech event is expected here")

    async def scenario():
        listener = Listener(Backends(encoder), gateway_pb2.SpeechInput(sample_rate=16000, detect_speech=True),
                            lambda: None, Callbacks(nothing, nothing, nothing))
        await listener.audio(np.zeros(1600, "<i2").tobytes())  # (the stand-ins never suspend: its reader waits to run)
        assert encoder.counted == 1 and len(listener.readers) == 1
        await asyncio.gather(*listener.cancel(), return_exceptions=True)
        assert encoder.calls[0].cancelled and encoder.counted == 0, (encoder.calls[0].cancelled, encoder.counted)

    asyncio.run(scenario())
