"""Which sequences run in the next step.

Waiting requests are admitted in arrival order while KV blocks and batch slots allow. Each step every
running sequence gets room for one more position; when blocks run out the newest running sequence is
preempted (blocks freed, recomputed later from its tokens). Chunked prefill under a token budget
arrives with the batched runner (issue 3).
"""

from __future__ import annotations

from collections import deque

from services.llm.block_manager import BlockManager
from services.llm.sequence import Sequence, Status


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> list[Sequence]:
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(seq):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq)
            seq.status = Status.RUNNING
            seq.scheduled = seq.scheduled or now
            self.running.append(seq)
        for seq in list(self.running):
            while seq in self.running and not self.block_manager.can_allocate(seq):
                self.preempt(self.running[-1])
            if seq in self.running:
                self.block_manager.allocate(seq)
        return list(self.running)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence) -> None:
        """Release a finished or aborted sequence wherever it is."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
