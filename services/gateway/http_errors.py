"""Typed errors → HTTP statuses and OpenAI's error body, in one place for the gateway's HTTP door (the gRPC
doors' mapping: services/common/interceptor.py).

The body is OpenAI's: {"error": {"message", "type", "param", "code"}}, so that the `openai` SDK raises its own
exception for each status (BadRequestError, AuthenticationError, RateLimitError, ...) with our message. A refusal
that may succeed later (RESOURCE_EXHAUSTED, a stage down) carries `Retry-After` in whole seconds, rounded up.
"""

from __future__ import annotations

import json
import math

from aiohttp import web

from services.common.errors import InvalidArgument, NotFound, ServiceError

# gRPC code (services/common/errors.py) → HTTP status
STATUS = {
    "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400, "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "RESOURCE_EXHAUSTED": 429, "CANCELLED": 499, "INTERNAL": 500,
    "UNIMPLEMENTED": 501, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504,
}
# HTTP status → OpenAI's (type, code)
KINDS = {
    400: ("invalid_request_error", None), 401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", None), 404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"), 413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"), 499: ("invalid_request_error", "cancelled"),
    500: ("server_error", None), 501: ("server_error", None), 503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"),
}
# A stage down is retried after the gateway's health checks had a chance to see it back (--ready-wait is the most a
# request waits for it).
UNAVAILABLE_RETRY_SECONDS = 1.0


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind, default_code = KINDS.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return {"error": {"message": message, "type": kind, "param": param, "code": code or default_code}}


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   retry_after: float | None = None) -> web.Response:
    headers = {"X-Content-Type-Options": "nosniff"}  # JSON, never sniffed as a page: the message may quote the client
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return web.json_response(error_body(status, message, param, code), status=status, headers=headers,
                             dumps=json.dumps)


def status_of(exc: ServiceError) -> int:
    return STATUS.get(exc.code, 500)


def from_service_error(exc: ServiceError) -> web.Response:
    status = status_of(exc)
    param = exc.field if isinstance(exc, InvalidArgument | NotFound) else None
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is None and status == 503:
        retry_after = UNAVAILABLE_RETRY_SECONDS
    return error_response(status, str(exc), param=param, retry_after=retry_after)


# WebSocket close codes (RFC 6455 §7.4) for an error that ends a /v1/converse session: the client's own fault
# (1008, policy violation), try again later (1013), or ours (1011). Going away (the client's close): 1000.
WS_CLOSE = {"INVALID_ARGUMENT": 1008, "NOT_FOUND": 1008, "FAILED_PRECONDITION": 1008, "OUT_OF_RANGE": 1008,
            "UNAUTHENTICATED": 1008, "PERMISSION_DENIED": 1008, "RESOURCE_EXHAUSTED": 1013, "UNAVAILABLE": 1013,
            "DEADLINE_EXCEEDED": 1013, "CANCELLED": 1000}


def ws_close_code(exc: ServiceError) -> int:
    return WS_CLOSE.get(exc.code, 1011)


def ws_error(exc: ServiceError) -> dict:
    """The last text frame of a session an error ends: its gRPC code, message and (for bad input) field."""
    param = exc.field if isinstance(exc, InvalidArgument | NotFound) else None
    return {"error": {"code": exc.code, "message": str(exc), "param": param}}


def raise_cut(request: web.Request) -> None:
    """Close the connection under a response: an HTTP body is seen cut short, not complete; a WebSocket ends with no
    close frame."""
    if request.transport is not None:
        request.transport.close()
