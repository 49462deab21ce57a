"""KV-cache blocks: a free list over the pool's block ids, one block table per sequence.

A block holds `block_size` positions of K and V for all layers (shared/DESIGN.md §3). This first
version allocates and frees; reference counts and prefix hashing come with the paged engine (issue 3).
"""

from __future__ import annotations

from collections import deque

from services.llm.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Sequence, num_tokens: int | None = None) -> bool:
        """Enough free blocks to hold `num_tokens` (default: all of seq's positions plus the next one)."""
        need = self.blocks_needed(num_tokens if num_tokens is not None else len(seq) + 1)
        return need - len(seq.block_table) <= self.num_free

    def allocate(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Grow seq's block table to cover `num_tokens` positions (default: len(seq) + 1)."""
        need = self.blocks_needed(num_tokens if num_tokens is not None else len(seq) + 1)
        if need - len(seq.block_table) > self.num_free:
            raise MemoryError(f"KV cache: {need - len(seq.block_table)} blocks needed, {self.num_free} free")
        while len(seq.block_table) < need:
            seq.block_table.append(self.free_blocks.popleft())

    def free(self, seq: Sequence) -> None:
        self.free_blocks.extend(seq.block_table)
        seq.block_table = []
        seq.num_cached = 0
