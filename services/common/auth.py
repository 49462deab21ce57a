"""API keys: a call to the API must carry `authorization: Bearer <key>` with one of the configured keys, or it
ends UNAUTHENTICATED before any work. Health checking and reflection stay open (load balancers and
orchestrators probe without keys).

Keys come from a file (one per line; blank lines and `#` comments ignored) and/or an environment variable
(comma-separated). A key is compared with every configured key in constant time (hmac.compare_digest), so
the time a refusal takes does not tell how much of a key was right, nor which key it was near.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
from pathlib import Path

import grpc

from services.common.errors import Unauthenticated
from services.common.interceptor import API_PREFIX

KEYS_ENV = "MOSS_API_KEYS"
CLIENT_KEY_ENV = "MOSS_API_KEY"  # what the project's clients (moss-serve say, bench) send


def load_keys(path: str | None, env: str = KEYS_ENV) -> list[bytes]:
    """→ the configured keys (empty: no auth). A file that cannot be read, or holds no key, is an error."""
    keys = [k.strip() for k in os.environ.get(env, "").split(",") if k.strip()]
    if path:
        lines = [line.strip() for line in Path(path).read_text().splitlines()]
        from_file = [line for line in lines if line and not line.startswith("#")]
        if not from_file:
            raise ValueError(f"{path}: no API key in it")
        keys += from_file
    return [k.encode() for k in keys]


def api_key(metadata) -> str | None:
    """The key a call's metadata carries (`authorization: Bearer <key>`, the scheme in any case), or None."""
    values = [v for k, v in (metadata or ()) if k == "authorization"]
    scheme, _, key = values[0].partition(" ") if values else ("", "", "")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def bearer(key: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `key` (none for no key)."""
    return (("authorization", f"Bearer {key}"),) if key else ()


# How long a refused bidirectional call's first message is waited for (see _refuse).
FIRST_MESSAGE_SECONDS = 1.0


def _refuse(message: str, reads_first: bool = False):
    async def refuse(request_or_iterator, context: grpc.aio.ServicerContext):
        if reads_first:
            # A bidirectional call's client writes its first message (a Converse config) as the call opens. Ended
            # before that write lands, the call gives the client gRPC core's bare INTERNAL ("Internal error from
            # Core", 18 of 200 refusals here) instead of this status: take the message, then refuse.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(context.read(), FIRST_MESSAGE_SECONDS)
        # Raised, not abort(): the ErrorInterceptor sets the status and counts the refusal before the status goes
        # out (abort() sends it first, so a client could read the metrics before its refusal was counted).
        raise Unauthenticated(message)
        yield  # never reached: an async generator, like the API's streaming methods it stands in for

    return refuse


def refusal(keys: list[bytes], metadata, carrier: str = "authorization metadata") -> str | None:
    """Why a call (its metadata: gRPC's, or an HTTP request's Authorization header as ("authorization", value))
    may not use the API, or None when it carries one of `keys`. carrier: what the messages call the key's place."""
    if not any(k == "authorization" for k, _ in (metadata or ())):
        return f"missing {carrier} (authorization: Bearer <API key>)"
    if (key := api_key(metadata)) is None:
        return f"{carrier} must be 'Bearer <API key>'"
    given = key.encode()
    match = False
    for known in keys:  # every key, always: no early exit that timing could reveal
        match |= hmac.compare_digest(given, known)
    return None if match else "invalid API key"


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, keys: list[bytes]):
        self.keys = keys

    def _allowed(self, metadata) -> str | None:
        """→ None if allowed, else why not."""
        return refusal(self.keys, metadata)
    # (Every method of the API streams its responses, so a refusal is a streaming handler too.)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(API_PREFIX):
            return handler  # health checking and reflection stay open
        why = self._allowed(details.invocation_metadata)
        if why is None:
            return handler
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(_refuse(why, reads_first=True), handler.request_deserializer,
                                                         handler.response_serializer)
        return grpc.unary_stream_rpc_method_handler(_refuse(why), handler.request_deserializer, handler.response_serializer)
