"""Writes to a client that may stop reading, on every door (gRPC streams, HTTP bodies, WebSocket frames).

A voice stream is written faster than it plays, so a client that stops reading fills the buffers between us and it,
and our next write waits. Each write waits at most the gateway's --client-stall-seconds; past that the call ends
with ClientStalled, and its turn stops in every stage, freeing its place (silent clients cannot hold
capacity).

The kernel's send buffer counts as "read": Linux grows a TCP socket's buffer up to tcp_wmem's maximum (4 MB, ~40 s of
24 kHz PCM), so a stall would show only after that much audio. HTTP and WebSocket sockets get SEND_BUFFER_BYTES
instead, still ~2.7 s of PCM (the kernel doubles it), far more than a client's bandwidth-delay product needs at the
rate of speech.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable

from services.common.errors import Cancelled

SEND_BUFFER_BYTES = 64 * 1024


class ClientStalled(Cancelled):
    """The client took nothing for the stall bound: the call ends, freeing what it held."""

    def __init__(self, seconds: float):
        super().__init__(f"the client took no message for {seconds:g} s (it stopped reading): the call was ended to "
                         f"free its place")


async def write_within(write: Awaitable, seconds: float | None) -> None:
    """Await one write to a client for at most `seconds` (None: as long as it takes); past it → ClientStalled."""
    if seconds is None:
        await write
        return
    try:
        async with asyncio.timeout(seconds):
            await write
    except TimeoutError:
        raise ClientStalled(seconds) from None


def bound_send_buffer(transport: asyncio.BaseTransport | None) -> None:
    """The send buffer of the transport's socket at SEND_BUFFER_BYTES (the module's docstring); a connection already
    gone is left."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
