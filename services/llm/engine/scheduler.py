"""Which sequences run in the next step, and how many of their positions.

Continuous batching: each step has a budget of `max_num_batched_tokens` positions. Running sequences go
first, oldest first: a decoding sequence takes one position, a sequence still in prefill takes the next
chunk of its prompt that fits, so a long prompt is spread over several steps instead of stalling the
streams already talking. Then waiting sequences are admitted in arrival order while the budget, the
batch size and the KV pool allow; the first that does not fit stops admission (no overtaking).

When a running sequence needs a block and none is free, `reclaim` is asked first (the blocks pinned for
sessions' next turns: pins.py), then the newest running sequence is preempted: its blocks are freed and it
waits at the front of the queue, to be recomputed (mostly from cached blocks) when there is room again. A
waiting sequence holds no block (they are allocated at admission), so admission in order never deadlocks:
when the head of the queue does not fit, only pins are asked to make room.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable

from services.llm.batch import ScheduledBatch
from services.llm.engine.block_manager import BlockManager
from services.llm.sequence import Sequence, Status


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 reclaim: Callable[[int], bool] = lambda blocks: False):
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs (one decode position each)")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.reclaim = reclaim
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in arrival order (a preempted one returns to its place): the last is the newest
        self.num_preemptions = 0
        self.preempted: list[Sequence] = []  # since the last take_preempted(): their per-run state goes

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Anything to step: a request waiting, or a running one not held."""
        return bool(self.waiting) or any(not seq.held for seq in self.running)

    def schedule(self, now: float) -> ScheduledBatch:
        batch = ScheduledBatch([], [])
        budget = self.max_num_batched_tokens
        for seq in list(self.running):
            if seq not in self.running or budget == 0 or seq.held:
                continue  # preempted while making room for an older one, no budget left, or held (LLMEngine.hold)
            if seq.num_cached == len(seq) - 1 and not self._make_room(seq):
                continue  # seq itself was preempted
            n = min(len(seq) - seq.num_cached, budget)
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self._room_for(seq):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.status = Status.RUNNING
            seq.scheduled = seq.scheduled or now
            bisect.insort(self.running, seq, key=lambda s: s.arrival)
            n = min(len(seq) - seq.num_cached, budget)
            batch.seqs.append(seq)
            batch.num_tokens.append(n)
            budget -= n
        return batch

    def _room_for(self, head: Sequence) -> bool:
        """Free enough blocks to admit the head of the queue, if pins hold them."""
        bm = self.block_manager
        if not bm.can_allocate(head):
            self.reclaim(bm.blocks_needed(len(head)))
        return bm.can_allocate(head)

    def _make_room(self, seq: Sequence) -> bool:
        """Ensure a decoding seq has a block for its next position; False if seq had to be preempted."""
        bm = self.block_manager
        while not bm.can_append(seq):
            if self.reclaim(1):
                continue
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        bm.append(seq)
        return True

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.preempted.append(seq)

    def take_preempted(self) -> list[Sequence]:
        taken, self.preempted = self.preempted, []
        return taken

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues (its blocks are the caller's to free)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
