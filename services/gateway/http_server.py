"""The gateway's HTTP door (--http-port, aiohttp, on the gRPC server's event loop): OpenAI's speech endpoint and
the probes a load balancer asks. Turns go through the same admission, stages and metrics as gRPC's (speech.py).

    POST /v1/audio/speech   OpenAI's request (openai_speech.py) → the audio, chunked as it is made
    GET  /v1/converse       a WebSocket: Converse's session for browsers (websocket.py)
    GET  /                  a web page to talk to the model (web/index.html: one static file)
    GET  /v1/models         the model served
    GET  /v1/audio/voices   the voices the caller may name; POST makes one from a recording, DELETE .../{name}
                            removes one (http_voices.py)
    GET  /healthz           200 while the process serves
    GET  /readyz            200 when every stage is ready (as the gRPC health check says SERVING), else 503

/v1/ needs `Authorization: Bearer <key>` when the gateway has API keys (the gRPC API's keys), or on the WebSocket
path `?api_key=<key>` (browsers cannot set a WebSocket's headers); the probes stay open. Errors are OpenAI's JSON
shape (http_errors.py). A speech response's headers go out with the turn's stream metadata, once admission and the
stages have taken it: anything refused before that gets its own status. After that a failure ends the stream: as an
`error` event with stream_format "sse", else by closing the connection before the chunked body's end, which a
client sees as a truncated response.

A client that takes no bytes for --client-stall-seconds is ended as a gRPC client is (the turn stops in every
stage, its place frees; gateway_stalled_calls_total{method="speech"}, or "websocket"); one that disconnects ends
its turn at once. One that sends slowly is ended too: a connection has --http-request-seconds to send a request's
headers (from its opening, or the end of its last response: aiohttp's keep-alive timer, which closes a connection
waiting for a whole request), and a speech request as long again for its body (408), so that connections held open
by trickled bytes (slowloris) cannot pile up. A request aiohttp's parser refuses (malformed: any client can send
one) is counted (gateway_http_malformed_requests_total) and logged at debug, once a minute per peer; a request cut
short by its client is counted under status 499.

A WebSocket's `Origin`, where a browser sends one, must be the page's own (its host and port as the request's Host)
or one of --allowed-origins: otherwise any web page in a local browser could drive a stack that has no keys
(cross-site WebSocket hijacking). Clients that are not browsers send none. The speech endpoint takes only
`Content-Type: application/json`, which a cross-site page cannot send without asking first (CORS), and this door
answers no such question.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from services.common.auth import api_key, refusal
from services.common.errors import ServiceError, echo
from services.common.server import GRACE_SECONDS
from services.common.stall import ClientStalled, bound_send_buffer, write_within
from services.gateway import metrics
from services.gateway.admission import client_id
from services.gateway.audio_encoding import encoder
from services.gateway.http_errors import error_response, from_service_error, raise_cut
from services.gateway.http_voices import VoiceRoutes
from services.gateway.openai_speech import MODEL, SpeechRequest, parse_speech, usage
from services.gateway.speech import Speech
from services.gateway.voice_book import VoiceBook
from services.gateway.websocket import WebSocketConverse

log = logging.getLogger(__name__)

SPEECH_ROUTE = "/v1/audio/speech"
CONVERSE_ROUTE = "/v1/converse"
OPEN_PATHS = ("/", "/healthz", "/readyz")  # the page (it asks for the key) and the probes: no key
PAGE = Path(__file__).with_name("web") / "index.html"


MALFORMED_LOG_SECONDS = 60.0  # a peer's malformed requests: one debug line a minute at most
SENT_WHOLE = "moss.sent_whole"  # request key: the status of a response sent whole (the client may leave after it)


@dataclass(frozen=True)
class DoorLimits:
    """The HTTP door's limits (the gateway's flags of the same names)."""

    max_body_bytes: int = 1 << 20          # a larger body (or WebSocket message) is refused
    stall_seconds: float | None = 10.0     # a write may wait this long for its client (None: as long as it takes)
    request_seconds: float = 15.0          # to send a request's headers, and a speech request's body again
    session_idle_seconds: float = 300.0    # a WebSocket session with nothing from its client and no turn running ends
    allowed_origins: tuple[str, ...] = ()  # WebSocket origins taken besides the page's own ("*": any)


class HttpDoor:
    def __init__(self, speech: Speech, keys: list[bytes], limits: DoorLimits, ready: Callable[[], bool],
                 voices: VoiceBook | None = None):
        """keys: API keys (none: open); ready(): every stage ready; voices: the gateway's voice book (default: one
        over the speech's backends)."""
        self.speech, self.keys, self.limits, self.ready = speech, keys, limits, ready
        book = voices if voices is not None else VoiceBook(speech.backends, speech.backends.voice_owners)
        self.voice_routes = VoiceRoutes(book, client_of, lambda r: origin_allowed(r.headers.get("Origin", ""), r,
                                                                                 limits.allowed_origins)
                                        if "Origin" in r.headers else True, limits.request_seconds)
        self.stall_seconds, self.max_body_bytes = limits.stall_seconds, limits.max_body_bytes
        self.converse_door = WebSocketConverse(speech, limits.session_idle_seconds, limits.max_body_bytes,
                                               limits.stall_seconds)
        self.app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[self._errors, self._auth])
        self.app.add_routes([web.post(SPEECH_ROUTE, self.synthesize), web.get(CONVERSE_ROUTE, self.converse),
                             web.get("/v1/models", self.models), *self.voice_routes.routes(),
                             web.get("/", self.page),
                             web.get("/healthz", self.healthz), web.get("/readyz", self.readyz)])
        self.runner: web.AppRunner | None = None

    async def start(self, host: str, port: int, ssl_context=None) -> None:
        # handler_cancellation: a client that disconnects cancels its handler, and so its turn, at once
        # shutdown_timeout: at a stop, requests (an open WebSocket session) get gRPC's grace, not aiohttp's 60 s
        # keepalive_timeout: a connection waiting for a whole request is closed after it (slowloris: module docstring)
        # logger: malformed requests are the client's, not errors of ours (MalformedRequestLog)
        self.runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None, shutdown_timeout=GRACE_SECONDS,
                                    keepalive_timeout=self.limits.request_seconds, logger=MalformedRequestLog(log))
        await self.runner.setup()
        try:
            await web.TCPSite(self.runner, host, port, ssl_context=ssl_context, reuse_port=False).start()
        except OSError as exc:
            await self.runner.cleanup()
            raise OSError(f"gateway: cannot bind HTTP {host}:{port} (--http-port): {exc.strerror or exc}") from None
        log.info("gateway: HTTP on %s:%d%s", host, port, " (TLS)" if ssl_context else "")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    # ---- middleware --------------------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler):
        """Every failure → OpenAI's error body with its status; every request counted by route and status."""
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        try:
            response = await handler(request)
        except ServiceError as exc:
            response = from_service_error(exc)
        except web.HTTPException as exc:  # aiohttp's own: no route (404), wrong method (405), body too large (413)
            message = (f"the body is over the limit of {self.max_body_bytes} bytes (--max-message-bytes)"
                       if exc.status == 413 else exc.reason)
            response = error_response(exc.status, message)
        except asyncio.CancelledError:  # the client left: before the response was whole, nginx's 499
            metrics.HTTP_REQUESTS.labels(route, str(request.get(SENT_WHOLE, 499))).inc()
            raise
        metrics.HTTP_REQUESTS.labels(route, str(response.status)).inc()
        return response

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.keys and request.path not in OPEN_PATHS:
            why = refusal(self.keys, presented_key(request), carrier="the Authorization header")
            if why is not None:
                return error_response(401, why)
        return await handler(request)

    # ---- routes ------------------------------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.ready():
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready: a stage (llm, vocoder) is not serving yet"}, status=503)

    async def page(self, request: web.Request) -> web.Response:
        return web.FileResponse(PAGE, headers={"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-cache"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "created": 0, "owned_by": "moss-speech-serve"}]})

    async def synthesize(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            return error_response(415, f"Content-Type {echo(request.content_type)}: send application/json")
        try:
            raw = await asyncio.wait_for(request.read(), self.limits.request_seconds)
        except TimeoutError:
            return await answer_and_close(request, error_response(
                408, f"the body did not arrive within {self.limits.request_seconds:g} s (--http-request-seconds)"))
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # (RecursionError: nested past Python's stack)
            return error_response(400, f"the body is not JSON: {exc}")
        spec = parse_speech(body, self.speech.limits)
        turn = self.speech.synthesize(spec.synthesize, client_of(request), lambda: None, "http")
        async with contextlib.aclosing(turn) as replies:
            first = await anext(replies)  # admission and the stages took the turn: the headers can go
            audio = encoder(spec.response_format, first.metadata.sample_rate, spec.speed)
            # Encoding and stretching cost ~5-40 ms of CPU a second of audio (aac, speed): off the event loop that
            # serves every other stream (pcm and wav are a copy)
            offload = spec.response_format not in ("pcm", "wav") or spec.speed != 1.0
            encode = asyncio.to_thread if offload else _at_once
            sse = spec.stream_format == "sse"
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream" if sse else audio.content_type,
                                                   "Cache-Control": "no-cache", "X-Request-Id": first.metadata.request_id})
            response.enable_chunked_encoding()
            await response.prepare(request)
            bound_send_buffer(request.transport)
            try:
                summary = None
                async for msg in replies:
                    if msg.HasField("audio"):
                        await self._send(response, spec, await encode(audio.feed, msg.audio.pcm))
                    elif msg.HasField("summary"):
                        summary = msg.summary
                await self._send(response, spec, await encode(audio.finish))
                if sse and summary is not None:
                    await self._write(response, event({"type": "speech.audio.done", "usage": usage(summary)}))
                await response.write_eof()
                request[SENT_WHOLE] = response.status  # (a client that leaves now has had it all: not a 499)
            except ClientStalled:  # (a Cancelled: before ServiceError)
                metrics.observe_stalled("speech")
                log.info("gateway: HTTP speech %s: the client took nothing for %g s: ended",
                         first.metadata.request_id, self.stall_seconds)
                raise_cut(request)
            except ServiceError as exc:  # after the headers: the stream ends saying why (sse), or is cut short
                log.info("gateway: HTTP speech %s failed mid-stream: %s", first.metadata.request_id, exc)
                if not sse:
                    raise_cut(request)
                    return response
                with contextlib.suppress(ConnectionError, ClientStalled):
                    await self._write(response, event({"type": "error", "error": error_body_of(exc)}))
                    await response.write_eof()
            except ConnectionError:  # the client went away: the turn ends with this handler
                pass
            return response

    async def converse(self, request: web.Request) -> web.StreamResponse:
        if (origin := request.headers.get("Origin")) is not None and not origin_allowed(origin, request,
                                                                                        self.limits.allowed_origins):
            return error_response(403, f"Origin {echo(origin)} is not allowed: a page of this host "
                                       f"({echo(request.host)}), or one of --allowed-origins")
        return await self.converse_door.handle(request, client_of(request))

    async def _send(self, response: web.StreamResponse, spec: SpeechRequest, data: bytes) -> None:
        if not data:
            return
        if spec.stream_format == "sse":
            data = event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        await self._write(response, data)

    async def _write(self, response: web.StreamResponse, data: bytes) -> None:
        """One write, waiting for the client at most --client-stall-seconds."""
        await write_within(response.write(data), self.stall_seconds)


async def _at_once(f, *args):
    return f(*args)


def event(payload: dict) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def error_body_of(exc: ServiceError) -> dict:
    return json.loads(from_service_error(exc).text)["error"]


def presented_key(request: web.Request) -> tuple[tuple[str, str], ...]:
    """The key a request carries, as call metadata: its Authorization header, or on the WebSocket path (browsers set
    no headers there) its `api_key` query parameter."""
    if (header := request.headers.get("Authorization")) is not None:
        return (("authorization", header),)
    if request.path == CONVERSE_ROUTE and (key := request.query.get("api_key")):
        return (("authorization", f"Bearer {key}"),)
    return ()


def client_of(request: web.Request) -> str | None:
    """Who an HTTP request is from, for --max-turns-per-client (admission.client_id)."""
    return client_id(api_key(presented_key(request)), peer_of(request))


def peer_of(request: web.Request) -> str:
    """The client's address in gRPC's peer form (admission.client_id)."""
    host = request.remote or ""
    return f"ipv6:[{host}]:0" if ":" in host else f"ipv4:{host}:0" if host else "http"


def origin_allowed(origin: str, request: web.Request, allowed: tuple[str, ...]) -> bool:
    """A browser's Origin header: the page's own (its host and port are the request's Host), or one of `allowed`
    (scheme://host[:port] as browsers send it, or "*")."""
    if "*" in allowed or origin.rstrip("/").lower() in {a.rstrip("/").lower() for a in allowed}:
        return True
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        return False
    return bool(netloc) and netloc.lower() == request.host.lower()


async def answer_and_close(request: web.Request, response: web.Response) -> web.Response:
    """Send `response`, then close the connection at once: what is left of the body is not read (aiohttp would read
    it for up to 10 s more before closing)."""
    await response.prepare(request)
    await response.write_eof()
    if request.protocol is not None:
        request.protocol.force_close()  # (the transport sends what was written before it closes)
    return response


class MalformedRequestLog:
    """aiohttp's server logger for the HTTP door. A request its parser refuses (bad request line, header, encoding:
    any client can send one) is counted (gateway_http_malformed_requests_total) and logged at debug, once per peer
    every MALFORMED_LOG_SECONDS, instead of as an ERROR with a traceback each; anything else (a handler's own failure:
    a bug of ours) stays an ERROR."""

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        self.last: dict[str, float] = {}  # peer → when its last line was logged

    def debug(self, msg, *args, exc_info=None, **kw) -> None:
        if isinstance(exc_info, HttpProcessingError):  # (aiohttp's own choice for a first request's bad method)
            self._malformed(args, exc_info)
        else:
            self.logger.debug(msg, *args, exc_info=exc_info, **kw)

    def exception(self, msg, *args, exc_info=None, **kw) -> None:
        if isinstance(exc_info, HttpProcessingError):
            self._malformed(args, exc_info)
        else:
            self.logger.exception(msg, *args, exc_info=exc_info or True, **kw)

    def _malformed(self, args: tuple, exc_info: HttpProcessingError) -> None:
        metrics.HTTP_MALFORMED.inc()
        now, peer = time.monotonic(), str(args[0]) if args else "?"
        if now - self.last.get(peer, -math.inf) >= MALFORMED_LOG_SECONDS:
            if len(self.last) > 1024:  # (a crowd of peers: forget the ones whose minute has passed)
                self.last = {p: t for p, t in self.last.items() if now - t < MALFORMED_LOG_SECONDS}
            self.last[peer] = now
            self.logger.debug("gateway: HTTP: a malformed request from %s: %s (more from it this minute: not logged)",
                              peer, str(exc_info).splitlines()[0] if str(exc_info) else type(exc_info).__name__)
