"""services/common/stall.py: a write bounded by the stall time, and the send buffer bound every HTTP door's socket
gets (so a client that stops reading is seen after seconds of audio, not after Linux's autotuned megabytes)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from services.common.errors import Cancelled
from services.common.stall import SEND_BUFFER_BYTES, ClientStalled, bound_send_buffer, write_within


def test_a_write_that_never_completes_is_a_stall_after_the_bound():
    async def main():
        never = asyncio.get_running_loop().create_future()
        started = asyncio.get_running_loop().time()
        with pytest.raises(ClientStalled) as err:
            await write_within(never, 0.2)
        return asyncio.get_running_loop().time() - started, err.value, never

    waited, err, never = asyncio.run(main())
    assert 0.2 <= waited < 1.0
    assert isinstance(err, Cancelled) and "0.2 s" in str(err)  # a Cancelled: gRPC CANCELLED, turns end as cancelled
    assert never.cancelled()  # the write itself was given up, not left pending


def test_a_write_that_completes_returns_and_none_waits_as_long_as_it_takes():
    async def main():
        loop = asyncio.get_running_loop()
        late = loop.create_future()
        loop.call_later(0.3, late.set_result, None)
        await write_within(late, None)
        await write_within(asyncio.sleep(0.01), 1.0)

    asyncio.run(main())


class Transport:
    """What bound_send_buffer reads of an asyncio transport."""

    def __init__(self, sock):
        self.sock = sock

    def get_extra_info(self, name):
        return self.sock if name == "socket" else None


def test_the_send_buffer_is_bounded_where_linux_would_grow_it():
    with socket.socket() as sock:
        bound_send_buffer(Transport(sock))
        # Linux reports twice what was set (its bookkeeping); unset, a TCP socket would start at tcp_wmem's default and
        # grow to its maximum (megabytes)
        assert SEND_BUFFER_BYTES <= sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * SEND_BUFFER_BYTES
    closed = socket.socket()
    closed.close()
    bound_send_buffer(Transport(closed))  # a socket the client already closed: nothing raised
    bound_send_buffer(Transport(None))
    bound_send_buffer(None)
