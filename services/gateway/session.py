"""What the gateway keeps of a Converse session between its turns: its history, and the llm replica that ran its
last turn.

The llm keeps no session: every turn sends the history (the session's tokens as each finished turn left them:
the llm reports what a turn added on its final chunk), and the llm reuses whatever its prefix cache holds of it.
The replica that ran the last turn has that turn's KV blocks pinned for the next one (services/llm/engine/pins.py),
so the next turn goes there while it is ready (backends.py) and computes only its own tokens; any other replica
serves it too, computing the history once. Pinned blocks are released when the session ends or moves away.
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

RELEASE_SECONDS = 2.0  # how long a ReleaseSession to an llm may take
_RELEASING: set[asyncio.Task] = set()  # ReleaseSession calls under way (a reference each, until done)


@dataclass
class Session:
    session_id: str
    system_prompt: str = ""
    replica: Replica | None = None  # the llm replica that ran the session's last turn; None before its first turn
    history: llm_pb2.PromptTokens = field(default_factory=llm_pb2.PromptTokens)

    def place(self, replica: Replica) -> None:
        """The session's next turn runs on `replica`. Moving it there (its replica was not ready) releases what
        the replica before pinned for it."""
        if replica is self.replica:
            return
        if self.replica is not None:
            log.info("gateway: session %s moves from %s to %s", self.session_id, self.replica, replica)
            metrics.SESSION_MOVES.inc()
            self.replica.add_sessions(-1)
            release(self.replica, self.session_id)
        self.replica = replica
        replica.add_sessions(1)

    def remember(self, turn_tokens: llm_pb2.PromptTokens | None) -> None:
        """A turn finished (its summary went to the client): its tokens join the history. A turn that came without
        them (an llm that does not report them) is left out of it, as a cancelled turn is."""
        if turn_tokens is None or not turn_tokens.text:
            log.warning("gateway: session %s: a finished turn came without its tokens; the history goes on without it",
                        self.session_id)
            return
        self.history.text.extend(turn_tokens.text)
        self.history.audio.extend(turn_tokens.audio)

    def request_history(self) -> llm_pb2.PromptTokens | None:
        """What a turn sends as GenerateRequest.history (None: the session's first turn)."""
        return self.history if self.history.text else None

    def close(self) -> None:
        """The session is over: what its replica pinned for it is released."""
        if self.replica is not None:
            self.replica.add_sessions(-1)
            release(self.replica, self.session_id)
            self.replica = None


def release(replica: Replica, session_id: str) -> None:
    """Have an llm replica release the blocks it pinned for a session, in the background (the call that ended the
    session may be cancelled while this runs). Best effort: a replica that cannot be told (down) gives pinned
    blocks back anyway when its pool needs them, least recently pinned first."""
    async def release_session():
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await replica.stub.ReleaseSession(llm_pb2.ReleaseSessionRequest(session_id=session_id),
                                              timeout=RELEASE_SECONDS)

    task = asyncio.create_task(release_session())
    _RELEASING.add(task)
    task.add_done_callback(_RELEASING.discard)
