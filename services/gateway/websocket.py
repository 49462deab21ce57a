"""WebSocket `/v1/converse` (the HTTP door, http_server.py): gRPC's Converse for browsers, the same session run by
the same Conversation (conversation.py): turns, barge-in, spoken turns, history, admission, idle end.

Frames, client → gateway:
- text: one ConverseRequest in protobuf's JSON form, field names as in gateway.proto (snake_case or lowerCamel):
  {"config": {"voice": "default"}} first, then {"turn": {"text": "Hello"}}, {"cancel": {}}, {"close": {}},
  {"speech": {"sample_rate": 16000, "detect_speech": true}}, {"end_of_speech": {}};
- binary: the user's speech (UserAudio's pcm, in the format its `speech` message gave).
Frames, gateway → client:
- text: every ConverseResponse but audio, in the same JSON form (session, metadata, text, summary, cancelled, failed,
  speech_started, speech_ended, ended), each with its `turn`;
- binary: a reply's audio, PCM in the session's format at the metadata's rate: the audio of the turn whose
  `metadata` came last (a cancelled turn's audio stops before its `cancelled`).
Errors that end the session (bad input: a frame that is not a ConverseRequest, a config not first) come as
{"error": {"code", "message", "param"}} and then a close frame (http_errors.WS_CLOSE codes). Closing the socket
ends the session at once: a turn running stops in every stage. A client that takes nothing for
--client-stall-seconds is ended as a gRPC client is.

Browsers cannot set headers on a WebSocket: the API key may come as `?api_key=` on this path instead of
`Authorization: Bearer` (http_server.presented_key).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from aiohttp import WSMsgType, web
from google.protobuf import json_format
from moss.speech.v1 import gateway_pb2

from services.common.errors import Cancelled, InvalidArgument, ServiceError, clip
from services.common.stall import ClientStalled, bound_send_buffer, write_within
from services.gateway import metrics
from services.gateway.conversation import Conversation
from services.gateway.http_errors import raise_cut, ws_close_code, ws_error
from services.gateway.speech import Speech
from services.gateway.turn_request import TRANSPORT_SLACK

log = logging.getLogger(__name__)


class WebSocketConverse:
    def __init__(self, speech: Speech, idle_seconds: float, max_message_bytes: int, stall_seconds: float | None):
        self.speech, self.idle_seconds = speech, idle_seconds
        self.max_message_bytes, self.stall_seconds = max_message_bytes, stall_seconds

    async def handle(self, request: web.Request, client: str | None) -> web.WebSocketResponse:
        # (a frame over the limit, up to TRANSPORT_SLACK times it, is the conversation's to answer: audio fails its turn)
        ws = web.WebSocketResponse(max_msg_size=TRANSPORT_SLACK * self.max_message_bytes, compress=False)
        await ws.prepare(request)
        bound_send_buffer(request.transport)
        s = self.speech
        conversation = Conversation(s.backends, s.limits, s.admission, self.idle_seconds, client, lambda: None,
                                    "websocket")
        try:
            async with contextlib.aclosing(conversation.run(self._requests(ws))) as replies:
                async for msg in replies:
                    await self._send(ws, msg)
            await ws.close()
        except ClientStalled:  # (a Cancelled: before ServiceError)
            metrics.observe_stalled("websocket")
            log.info("gateway: WebSocket session: the client took nothing for %g s: ended", self.stall_seconds)
            raise_cut(request)
        except ServiceError as exc:
            if not isinstance(exc, Cancelled) or not ws.closed:
                with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
                    await asyncio.wait_for(ws.send_str(json.dumps(ws_error(exc))), 1.0)
            await ws.close(code=ws_close_code(exc), message=clip(str(exc), 123).encode())  # (a close reason: 123 bytes)
        except ConnectionError:  # the client went away mid-write: the session ended with the loop above
            pass
        return ws

    async def _requests(self, ws: web.WebSocketResponse):
        """The client's frames as ConverseRequests. Its close (or a broken socket) ends the session at once."""
        async for frame in ws:
            if frame.type == WSMsgType.TEXT:
                try:
                    yield json_format.Parse(frame.data, gateway_pb2.ConverseRequest())
                except json_format.ParseError as exc:
                    raise InvalidArgument("message", f"not a ConverseRequest in JSON: {exc}") from None
            elif frame.type == WSMsgType.BINARY:
                yield gateway_pb2.ConverseRequest(audio=gateway_pb2.UserAudio(pcm=frame.data))
            elif frame.type == WSMsgType.ERROR:
                break
        raise Cancelled("the client closed the WebSocket")

    async def _send(self, ws: web.WebSocketResponse, msg: gateway_pb2.ConverseResponse) -> None:
        if msg.WhichOneof("kind") == "audio":
            send = ws.send_bytes(msg.audio.pcm)
        else:
            send = ws.send_str(json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True)))
        await write_within(send, self.stall_seconds)
