"""Whether a client takes what the gateway writes to it. A turn whose client has left its last audio waiting too long
stops feeding its stages (pipeline.Turn._client_reading); a Synthesize turn marks its own writes, a Converse session's
writer marks the session's (conversation.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time


class ClientWrites:
    """Whether a client is taking what the gateway writes to it: `writing_since` while a message waits for it."""

    def __init__(self):
        self.writing_since: float | None = None
        self.took = asyncio.Event()  # set while no message waits
        self.took.set()

    @contextlib.contextmanager
    def writing(self):
        """Around one write to the client (a yield that returns once it is sent, or the call ends)."""
        self.writing_since = time.perf_counter()
        self.took.clear()
        try:
            yield
        finally:
            self.writing_since = None
            self.took.set()

    def waiting_for(self, seconds: float) -> bool:
        """Has a message waited for the client longer than `seconds`?"""
        return self.writing_since is not None and time.perf_counter() - self.writing_since > seconds
