"""Multi-turn sessions: a conversation's tokens and its KV blocks, kept between turns.

A turn of a session runs as a sequence that starts from the session's tokens and takes over its block
table, so it computes only the positions the cache lacks: the new user turn (and the few tokens of the
previous reply that were sampled but never fed back). When the turn finishes, the tokens and blocks go
back to the session, closed with `<|im_end|>\\n`. One turn at a time per session.

Idle sessions hold blocks; when the pool runs short, `reclaim` frees them least recently used first
(their full blocks stay hashed in the block manager, so a later turn still reuses most of them), and
the number of sessions is capped with the same order.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from services.common.errors import FailedPrecondition
from services.llm.engine.block_manager import BlockManager
from services.llm.sequence import Sequence


class SessionBusy(FailedPrecondition):
    """A turn of the session is still running."""


@dataclass
class Session:
    session_id: str
    text_ids: list[int] = field(default_factory=list)
    audio_ids: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_cached: int = 0
    text_kv_upto: int = 0
    busy: bool = False
    resume: tuple[int, int] = (0, 0)  # num_cached and text_kv_upto when the running turn began
    closing: bool = False  # closed while a turn ran: forgotten when that turn ends


class SessionStore:
    def __init__(self, block_manager: BlockManager, max_sessions: int = 1024):
        self.block_manager = block_manager
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self.sessions)

    def history_len(self, session_id: str) -> int:
        session = self.sessions.get(session_id)
        return len(session.text_ids) if session else 0

    def adopt(self, session_id: str, text_ids: list[int], audio_ids: list[int]) -> None:
        """Make the caller's copy of a session's history ours, before its next turn begins. A copy we hold
        that is the same is kept with its blocks; a different one (a turn the caller never saw end) or none
        (restarted, let go, or another replica's session) starts again from the caller's, with no blocks:
        the turn's allocation reuses whatever of it the prefix cache still holds."""
        session = self.sessions.get(session_id)
        if session is not None:
            if session.busy:
                raise SessionBusy(f"session_id: session {session_id!r} already has a turn running")
            if session.text_ids == text_ids and session.audio_ids == audio_ids:
                return
            self._release(session)
        else:
            session = self.sessions[session_id] = Session(session_id)
            self._cap()
        session.text_ids, session.audio_ids = list(text_ids), list(audio_ids)

    def begin(self, seq: Sequence, turn_start: int) -> None:
        """Start seq as the session's next turn: history + seq's turn tokens, the session's blocks."""
        session = self.sessions.get(seq.session_id)
        if session is None:
            session = self.sessions[seq.session_id] = Session(seq.session_id)
            self._cap()
        if session.busy:
            raise SessionBusy(f"session_id: session {seq.session_id!r} already has a turn running")
        self.sessions.move_to_end(seq.session_id)
        session.busy = True
        seq.history_len = len(session.text_ids)
        if session.text_ids:
            seq.text_ids = session.text_ids + seq.text_ids[turn_start:]
            seq.audio_ids = session.audio_ids + seq.audio_ids[turn_start:]
            seq.num_prompt = len(seq.text_ids)
        seq.block_table, seq.block_hashes, seq.num_cached = session.block_table, session.block_hashes, session.num_cached
        seq.text_kv_upto = session.text_kv_upto
        session.resume = (session.num_cached, session.text_kv_upto)
        session.block_table, session.block_hashes, session.num_cached, session.text_kv_upto = [], [], 0, 0

    def end(self, seq: Sequence, closing_text: list[int], closing_audio: list[int]) -> tuple[list[int], list[int]]:
        """The turn finished: keep its tokens, closed, and its blocks for the next turn → the positions the
        turn added to the history (both channels), for its caller to keep."""
        session = self.sessions[seq.session_id]
        session.text_ids = seq.text_ids + closing_text
        session.audio_ids = seq.audio_ids + closing_audio
        added = session.text_ids[seq.history_len:], session.audio_ids[seq.history_len:]
        session.block_table, session.block_hashes, session.num_cached = seq.block_table, seq.block_hashes, seq.num_cached
        session.text_kv_upto = min(seq.text_kv_upto, seq.num_cached)
        seq.block_table, seq.block_hashes, seq.num_cached, seq.text_kv_upto = [], [], 0, 0
        session.busy = False
        self._close_if_closing(session)
        return added

    def abort(self, seq: Sequence) -> None:
        """The turn was aborted (barge-in): the session keeps its history from before the turn, and takes back
        the blocks of that history the turn still holds; the caller then frees the rest of seq's blocks. The
        turn wrote only past the history, so those blocks hold the history's K/V unchanged. A history block
        the turn filled up was hashed with the turn's tokens: its hash is dropped before the next turn writes
        there, and if another sequence shares it, the session keeps only the blocks before it."""
        session = self.sessions.get(seq.session_id)
        if session is None:
            return
        session.busy = False
        history_cached, history_text_kv = session.resume
        size = self.block_manager.block_size
        if not history_cached or seq.num_cached < history_cached:  # nothing held, or preempted meanwhile
            self._close_if_closing(session)
            return
        full, keep = history_cached // size, -(-history_cached // size)
        if keep > full and keep <= len(seq.block_hashes) and not self.block_manager.reclaim_for_writing(seq.block_table[full]):
            keep = history_cached = full
        session.block_table, seq.block_table = seq.block_table[:keep], seq.block_table[keep:]
        session.block_hashes, seq.block_hashes = seq.block_hashes[:full], seq.block_hashes[full:]
        session.num_cached = history_cached
        session.text_kv_upto = min(history_text_kv, history_cached)
        self._close_if_closing(session)

    def reclaim(self, blocks_needed: int) -> bool:
        """Free idle sessions' blocks, least recently used first, until `blocks_needed` are free.
        True if any block was freed."""
        freed = False
        for session in self.sessions.values():
            if self.block_manager.num_free >= blocks_needed:
                break
            if not session.busy and session.block_table:
                self._release(session)
                freed = True
        return freed

    def close(self, session_id: str) -> bool:
        """Forget the session and free its blocks; one with a turn running goes when that turn ends (its
        client may close it before this engine has seen the turn's cancel: they come by different calls).
        False if there is no such session."""
        session = self.sessions.get(session_id)
        if session is None:
            return False
        session.closing = True
        self._close_if_closing(session)
        return True

    def _close_if_closing(self, session: Session) -> None:
        if session.closing and not session.busy:
            self._release(session)
            del self.sessions[session.session_id]

    def _release(self, session: Session) -> None:
        self.block_manager.release(session.block_table)
        session.block_table, session.block_hashes, session.num_cached, session.text_kv_upto = [], [], 0, 0

    def _cap(self) -> None:
        for session_id, session in list(self.sessions.items()):
            if len(self.sessions) <= self.max_sessions:
                break
            if not session.busy:
                self._release(session)
                del self.sessions[session_id]
