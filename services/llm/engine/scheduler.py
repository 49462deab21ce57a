"""Which sequences run in the next step, and how many of their positions.

Continuous batching: each step has a budget of `max_num_batched_tokens` positions. Running sequences go
first, oldest first: a decoding sequence takes one position, a sequence still in prefill takes the next
chunk of its prompt that fits, so a long prompt is spread over several steps instead of stalling the
streams already talking. Then waiting sequences are admitted in arrival order while the budget, the
batch size and the KV pool allow; the first that does not fit stops admission (no overtaking).

A held sequence (its listener stopped taking audio: LLMEngine.hold) leaves the running batch for `parked`,
keeping its blocks: it takes no running place (`max_num_seqs` counts only sequences that step), so requests that
can run are never kept waiting behind clients that stopped reading. Released, it takes the next running place
free, ahead of the queue (its K/V are in: it costs no prefill). A sequence held while it waits for admission
holds no block; released, it queues again in its arrival order.

When a running sequence needs a block and none is free, `reclaim` is asked first (the blocks pinned for
sessions' next turns: pins.py), then the parked sequences give theirs up, newest first (released, they are
recomputed, mostly from cached blocks), then the newest running sequence is preempted: its blocks are freed
and it waits at the front of the queue, to be recomputed when there is room again. A waiting sequence holds
no block (they are allocated at admission), so admission in order never deadlocks: when the head of the queue
does not fit, pins and parked sequences are asked to make room, and only an empty pool too small for it could
refuse it (LLMEngine.make_sequence refuses such a request before it is queued).
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
        self.parked: list[Sequence] = []   # held, or released and waiting for a running place; in arrival order
        self.num_preemptions = 0
        self.left: list[Sequence] = []  # left the running batch since the last take_left(): their per-run state goes

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Anything to step: a request running or waiting, or one released and waiting for a running place."""
        return bool(self.waiting or self.running) or any(not seq.held for seq in self.parked)

    def num_queued(self) -> int:
        """Sequences that would step if there were room: waiting, or released and waiting for a running place."""
        return len(self.waiting) + sum(not seq.held for seq in self.parked)

    def hold(self, seq: Sequence) -> None:
        """seq.held was set: it leaves the running batch (or the queue) for `parked`, keeping any blocks it has."""
        if seq in self.running:
            self.running.remove(seq)
            self.left.append(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        else:
            return  # parked already, or finished
        bisect.insort(self.parked, seq, key=lambda s: s.arrival)

    def release(self, seq: Sequence) -> None:
        """seq.held was cleared: with its blocks it takes the next running place free (schedule); without (held
        while waiting, or its blocks given up meanwhile) it queues again in its arrival order."""
        if seq in self.parked and not seq.block_table:
            self.parked.remove(seq)
            self._queue_in_order(seq)

    def schedule(self, now: float) -> ScheduledBatch:
        batch = ScheduledBatch([], [])
        budget = self.max_num_batched_tokens
        for seq in [seq for seq in self.parked if not seq.held]:  # released: their K/V are in, ahead of the queue
            if len(self.running) >= self.max_num_seqs:
                break
            self.parked.remove(seq)
            bisect.insort(self.running, seq, key=lambda s: s.arrival)
        for seq in list(self.running):
            if seq not in self.running or budget == 0:
                continue  # preempted while making room for an older one, or no budget left
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
        """Free enough blocks to admit the head of the queue, if pins or parked sequences hold them."""
        bm = self.block_manager
        if not bm.can_allocate(head):
            self.reclaim(bm.blocks_needed(len(head)))
        while not bm.can_allocate(head) and self._unpark_one():
            pass
        return bm.can_allocate(head)

    def _make_room(self, seq: Sequence) -> bool:
        """Ensure a decoding seq has a block for its next position; False if seq had to be preempted."""
        bm = self.block_manager
        while not bm.can_append(seq):
            if self.reclaim(1) or self._unpark_one():
                continue
            victim = self.running[-1]
            self.preempt(victim)
            if victim is seq:
                return False
        bm.append(seq)
        return True

    def _unpark_one(self) -> bool:
        """The newest parked sequence with blocks gives them up (released, it is recomputed) → whether one did."""
        victim = next((seq for seq in reversed(self.parked) if seq.block_table), None)
        if victim is None:
            return False
        self.block_manager.free(victim)
        victim.status = Status.WAITING
        self.num_preemptions += 1
        if not victim.held:  # released and waiting for a running place: it queues again instead
            self.parked.remove(victim)
            self._queue_in_order(victim)
        return True

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.left.append(seq)

    def _queue_in_order(self, seq: Sequence) -> None:
        """Into the queue at its arrival's place (the queue is in arrival order, preempted sequences at its front)."""
        seq.status = Status.WAITING
        at = next((i for i, other in enumerate(self.waiting) if other.arrival > seq.arrival), len(self.waiting))
        self.waiting.insert(at, seq)

    def take_left(self) -> list[Sequence]:
        """The sequences that left the running batch (preempted, held) since the last call."""
        taken, self.left = self.left, []
        return taken

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out of the queues (its blocks are the caller's to free)."""
        for queue in (self.running, self.waiting, self.parked):
            if seq in queue:
                queue.remove(seq)
                return
