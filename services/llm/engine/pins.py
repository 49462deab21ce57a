"""Pins: the KV blocks of a live session's last finished turn, held for its next turn.

The llm keeps nothing else of a session: every turn comes with the session's history (its caller keeps it:
each turn's final chunk says what the turn added) and runs as one request over history + turn, its K/V reused
through the prefix cache (block_manager.py). A finished turn's blocks would be free then, and a busy pool would
hand them out before the session's next turn; so they are pinned under the session's id, its partly filled last
block made known to the cache too, until the session's next turn ends (its blocks replace them), its caller
releases them (the session ended), or the pool runs short: pins give their blocks back least recently kept
first, as the cap on pinned sessions does. An unpinned block keeps its contents until it is handed out again.
"""

from __future__ import annotations

from collections import OrderedDict

from services.llm.engine.block_manager import BlockManager
from services.llm.sequence import Sequence


class Pins:
    def __init__(self, block_manager: BlockManager, max_sessions: int = 1024):
        self.block_manager = block_manager
        self.max_sessions = max_sessions
        self.tables: OrderedDict[str, list[int]] = OrderedDict()  # session id → its blocks, least recently kept first

    def __len__(self) -> int:
        return len(self.tables)

    def keep(self, session_id: str, seq: Sequence) -> None:
        """A turn of the session finished: its blocks (references and all) are the session's pin now, in place of
        the last turn's; seq holds none after."""
        self.block_manager.keep_partial(seq)
        self.release(session_id)
        self.tables[session_id] = self.block_manager.detach(seq)
        while len(self.tables) > self.max_sessions:
            self._let_go(next(iter(self.tables)))

    def release(self, session_id: str) -> bool:
        """The session's pin goes (its blocks stay in the cache until needed); False if it had none."""
        if session_id not in self.tables:
            return False
        self._let_go(session_id)
        return True

    def reclaim(self, blocks_needed: int) -> bool:
        """Let pins go, least recently kept first, until `blocks_needed` blocks are free. True if any went."""
        freed = False
        while self.tables and self.block_manager.num_free < blocks_needed:
            self._let_go(next(iter(self.tables)))
            freed = True
        return freed

    def _let_go(self, session_id: str) -> None:
        self.block_manager.release(self.tables.pop(session_id))
