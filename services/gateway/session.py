"""What the gateway keeps of a Converse session between its turns: its llm replica and its history.

The llm replica holds the session's KV cache, so every turn goes there while it is ready (backends.py).
The history is the session's tokens as each finished turn left them (the llm reports them on a turn's final
chunk), sent with every turn: the replica continues its own copy when that copy is the same, and starts the
session again from this one when it has none (the session moved because its replica was down; the replica
restarted; it let the session go) or a different one (a turn whose end the gateway never passed on). So the
conversation goes on, as the listener heard it, wherever it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import grpc
from moss.speech.v1 import llm_pb2

from services.gateway import metrics
from services.gateway.backends import Replica

log = logging.getLogger(__name__)

CLOSE_SESSION_SECONDS = 2.0  # how long a CloseSession to an llm may take
_FORGETTING: set[asyncio.Task] = set()  # CloseSession calls under way (a reference each, until done)


@dataclass
class Session:
    session_id: str
    system_prompt: str = ""
    replica: Replica | None = None  # the llm replica that holds the session; None before its first turn
    history: llm_pb2.PromptTokens = field(default_factory=llm_pb2.PromptTokens)
    history_known: bool = True      # False once a finished turn came without its tokens: the llm's copy is all there is

    def place(self, replica: Replica) -> None:
        """The session's next turn runs on `replica`. Moving it there (its replica was not ready) leaves a copy
        behind, which that replica is told to forget."""
        if replica is self.replica:
            return
        if self.replica is not None:
            log.info("gateway: session %s moves from %s to %s", self.session_id, self.replica, replica)
            metrics.SESSION_MOVES.inc()
            self.replica.add_sessions(-1)
            forget(self.replica, self.session_id)
        self.replica = replica
        replica.add_sessions(1)

    def remember(self, turn_tokens: llm_pb2.PromptTokens | None) -> None:
        """A turn finished (its summary went to the client): its tokens join the history."""
        if turn_tokens is None or not turn_tokens.text:
            self.history_known = False
            return
        self.history.text.extend(turn_tokens.text)
        self.history.audio.extend(turn_tokens.audio)

    def request_history(self) -> llm_pb2.PromptTokens | None:
        """What a turn sends as GenerateRequest.history."""
        return self.history if self.history_known and self.history.text else None

    def close(self) -> None:
        """The session is over: its replica forgets it (after the turn running there, if any)."""
        if self.replica is not None:
            self.replica.add_sessions(-1)
            forget(self.replica, self.session_id)
            self.replica = None


def forget(replica: Replica, session_id: str) -> None:
    """Have an llm replica forget a session (its history and KV blocks), in the background. Best effort: a
    replica that cannot be told (down) reclaims idle sessions anyway, least recently used first."""
    async def close_session():
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await replica.stub.CloseSession(llm_pb2.CloseSessionRequest(session_id=session_id),
                                            timeout=CLOSE_SESSION_SECONDS)

    task = asyncio.create_task(close_session())
    _FORGETTING.add(task)
    task.add_done_callback(_FORGETTING.discard)
