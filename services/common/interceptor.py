"""Typed errors → gRPC status codes, in one place, for every method of moss.speech.v1 services.

Servicers raise services.common.errors types (or let them propagate from the engines); this
interceptor ends the call with the mapped code, the error's message and its retry hint, reports each call's final
code to `on_done` (for the `<service>_requests_total{code}` counter), and turns anything unexpected into
INTERNAL without crashing the server. It sets the status and lets the call end rather than calling abort(), and
wraps each method's handler once: a refusal in a burst of them costs ~20 us of Python here (bare grpc.aio's own
work for a call is ~10-20x that), where abort() and wrapping per call made it ~80.

A request that is no message of its type (bytes a protobuf parser refuses: corrupt, or a string that is not UTF-8)
ends INVALID_ARGUMENT, "request: ..." (grpc's own answer is UNKNOWN for a unary request and a logged traceback; a
streaming one's surfaced in the handler as an internal error). Each method's deserializer is wrapped: a streaming
request's raises InvalidArgument where the handler reads the message; a unary request's returns it as `_Undecodable`,
raised as the call starts.

With `write_timeout` (the gateway's `--client-stall-seconds`), a streaming call whose client takes no message
for that long is ended. A client that stops reading is not seen otherwise: its messages fill HTTP/2's flow-control
windows (grpc's grow to megabytes, ~80 s of 24 kHz audio for one call; a connection's streams share one), and then
the next write waits for as long as the client does, holding the call's admission place and its stages. The call's
handler is closed, which frees all of that, and the call ends CANCELLED at once on the server; gRPC sends that
status behind the messages the client has not read yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable

import grpc
from google.protobuf.message import DecodeError

from services.common.errors import InvalidArgument, ServiceError
from services.common.stall import ClientStalled, write_within

log = logging.getLogger(__name__)

API_PREFIX = "/moss.speech.v1."


def status_code(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, ServiceError):
        return grpc.StatusCode[exc.code]
    return grpc.StatusCode.INTERNAL


def trailing_metadata(exc: ServiceError) -> tuple[tuple[str, str | bytes], ...]:
    """An error's retry hint, if it has one, two ways: gRPC's rich status (`grpc-status-details-bin`: a
    google.rpc.Status holding a google.rpc.RetryInfo), and `retry-after-ms` for clients without those protos."""
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is None:
        return ()
    return _retry_metadata(status_code(exc).value[0], str(exc), round(retry_after * 1000))


@functools.lru_cache(maxsize=64)  # a burst of refusals says the same thing with the same hint: built once
def _retry_metadata(code: int, message: str, retry_ms: int) -> tuple[tuple[str, str | bytes], ...]:
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    delay = duration_pb2.Duration()
    delay.FromMilliseconds(retry_ms)
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    status = status_pb2.Status(code=code, message=message, details=[detail])
    return (("grpc-status-details-bin", status.SerializeToString()), ("retry-after-ms", str(retry_ms)))


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, on_done: Callable[[str, str], None] = lambda method, code: None,
                 write_timeout: float | None = None, on_stalled: Callable[[str], None] = lambda method: None):
        """write_timeout: seconds a streaming call's write may wait for its client (None: as long as it takes);
        on_stalled(method): a call ended for it."""
        self.on_done, self.write_timeout, self.on_stalled = on_done, write_timeout, on_stalled
        self.wrapped: dict[str, tuple[object, object]] = {}  # a method → (its handler, that handler wrapped)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(API_PREFIX):
            return handler
        # A method's handler is the same object for every call: wrap it once, not per call (in a burst of ~128
        # refusals every microsecond of a call's own work delays the last one). An interceptor after this one may
        # hand a call a handler of its own (a refused API key's): wrapped for that call, and kept until the next.
        known = self.wrapped.get(details.method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self._wrap(details.method.rsplit("/", 1)[-1], handler)
        self.wrapped[details.method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler):
        wrap_stream = self._wrap_stream if self.write_timeout is None else self._wrap_writes
        deserialize = handler.request_deserializer
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                wrap_stream(method, handler.unary_stream),
                request_deserializer=_parse_unary(deserialize),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                wrap_stream(method, handler.stream_stream),
                request_deserializer=_parse_streamed(deserialize),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=_parse_unary(deserialize),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, handler.stream_unary),
                request_deserializer=_parse_streamed(deserialize),
                response_serializer=handler.response_serializer,
            )
        return handler

    def _wrap_unary(self, method: str, behavior):
        async def wrapper(request, context: grpc.aio.ServicerContext):
            async def one():
                yield await behavior(request, context)

            response = None  # (the status's, if the method failed: gRPC sends no message then)
            async for response in self._wrap_stream(method, lambda r, c: one())(request, context):
                pass  # run to its end, so that the call is counted now (returning inside left that to the collector)
            return response

        return wrapper

    def _wrap_stream(self, method: str, behavior):
        async def wrapper(request, context: grpc.aio.ServicerContext):
            with _Ending(self, method, context):
                if isinstance(request, _Undecodable):
                    raise request.error
                async for response in behavior(request, context):
                    yield response

        return wrapper

    def _wrap_writes(self, method: str, behavior):
        """As _wrap_stream, but each response is written within write_timeout (the module's docstring)."""
        async def wrapper(request, context: grpc.aio.ServicerContext):
            with _Ending(self, method, context):
                if isinstance(request, _Undecodable):
                    raise request.error
                async with contextlib.aclosing(behavior(request, context)) as inner:  # closed, and its cleanup run,
                    async for response in inner:                                     # before the status goes out
                        try:
                            await write_within(context.write(response), self.write_timeout)
                        except ClientStalled:
                            self.on_stalled(method)
                            raise

        return wrapper

    def _settle(self, method: str, context: grpc.aio.ServicerContext, exc: Exception) -> str:
        """A call's error as its status → the status code's name. An AbortError (the method's own abort()) has its
        status already; the caller raises it on."""
        if isinstance(exc, ServiceError):
            # The status set and the call let end, not abort(): for a stalled client abort() would wait until it
            # reads what it has not yet, and in a burst of refusals each AbortError raised up through the call's
            # layers is work that delays the last one.
            metadata = trailing_metadata(exc)
            if metadata:
                context.set_trailing_metadata(metadata)
            context.set_code(status_code(exc))
            context.set_details(str(exc))
            return exc.code
        if isinstance(exc, grpc.aio.AbortError):
            return context.code().name if context.code() else "UNKNOWN"
        log.exception("%s failed", method)
        context.set_code(grpc.StatusCode.INTERNAL)
        context.set_details(f"internal error: {type(exc).__name__}: {exc}")
        return "INTERNAL"


class _Undecodable:
    """A unary request's bytes that are no message of its type: its error, raised once the call's handler runs."""

    def __init__(self, error: InvalidArgument):
        self.error = error


def _undecodable(exc: DecodeError) -> InvalidArgument:
    return InvalidArgument("request", f"not a message of its type ({exc})")


def _parse_unary(deserialize):
    if deserialize is None:  # (a method taking raw bytes)
        return None

    def parse(data: bytes):
        try:
            return deserialize(data)
        except DecodeError as exc:
            return _Undecodable(_undecodable(exc))
    return parse


def _parse_streamed(deserialize):
    if deserialize is None:
        return None

    def parse(data: bytes):
        try:
            return deserialize(data)
        except DecodeError as exc:
            raise _undecodable(exc) from None
    return parse


class _Ending:
    """How a call ended, around its handler's work: an error becomes its status (ErrorInterceptor._settle) and is
    not raised on, except a cancellation and the method's own abort(); the code is reported to on_done. A class,
    not contextlib's generator: one more async generator a call is work in a burst of refusals."""

    def __init__(self, interceptor: ErrorInterceptor, method: str, context: grpc.aio.ServicerContext):
        self.interceptor, self.method, self.context = interceptor, method, context

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        code, swallow = "OK", False
        if isinstance(exc, asyncio.CancelledError):
            code = "CANCELLED"
        elif isinstance(exc, Exception):
            code = self.interceptor._settle(self.method, self.context, exc)
            swallow = not isinstance(exc, grpc.aio.AbortError)
        self.interceptor.on_done(self.method, code)
        return swallow
