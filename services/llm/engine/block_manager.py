"""KV-cache blocks: reference-counted, with full blocks hashed for prefix reuse.

A block holds `block_size` positions of K and V for all 40 layers (docs/architecture.md §3); a sequence's
block table lists its blocks in position order. A full block is known by a hash chained over every
(text, audio) pair from the sequence start through the block, so two sequences that agree on a prefix
(the system prompt, a session's history, a preempted request coming back) share those blocks.

A block's hash is registered only once its K/V have been computed (`commit`), so a lookup never finds a
block that a chunked prefill has not written yet. A freed block keeps its hash and contents until it is
handed out again, so recently freed prefixes still hit. Free blocks are reused oldest-freed first.
"""

from __future__ import annotations

from collections import OrderedDict

from services.llm.sequence import Sequence

NO_HASH = -1


def block_hash(parent: int, text: list[int], audio: list[int]) -> int:
    # Python's hash of a tuple of ints is deterministic (no per-process salt for ints).
    return hash((parent, tuple(text), tuple(audio)))


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "tokens")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
        self.tokens: tuple | None = None  # (text, audio) of a hashed block, checked on every hit


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # oldest freed first
        self.hash_to_block: dict[int, int] = {}
        self.hit_tokens = 0      # prompt positions served from the cache
        self.queried_tokens = 0  # prompt positions looked up

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_ids)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- handing blocks out and back -------------------------------------------------------------
    def _take(self, block_id: int | None = None) -> int:
        """A free block (the given one, or the oldest freed), now referenced once."""
        if block_id is None:
            block_id = next(iter(self.free_ids))
        del self.free_ids[block_id]
        block = self.blocks[block_id]
        block.ref_count = 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_ids[block_id] = None

    def _evict_hash(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.hash != NO_HASH and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
        block.hash, block.tokens = NO_HASH, None

    # ---- the protocol ----------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence) -> bool:
        """Room for every position of seq that has no block yet (cache hits not counted on)."""
        return self.blocks_needed(len(seq)) - len(seq.block_table) <= self.num_free

    def allocate(self, seq: Sequence) -> None:
        """Give a sequence that holds no blocks a table covering all its positions, reusing cached
        full blocks of its longest cached prefix; seq.num_cached tells how many positions hit.

        Only blocks that end before the last position may hit: that position must be computed to
        give the next token's logits."""
        if seq.block_table:  # a session's turn arrives with the session's blocks: only grow
            return self.append(seq)
        parent, hitting = NO_HASH, True
        for i in range(self.blocks_needed(len(seq))):
            start, end = i * self.block_size, (i + 1) * self.block_size
            block_id = None
            if hitting and end <= len(seq) - 1:
                text, audio = seq.text_ids[start:end], seq.audio_ids[start:end]
                parent = block_hash(parent, text, audio)
                block_id = self.hash_to_block.get(parent)
                if block_id is not None and self.blocks[block_id].tokens != (tuple(text), tuple(audio)):
                    block_id = None  # a hash collision: treat as a miss
            if block_id is None:
                hitting = False
                self._evict_hash(block_id := self._take())
            elif block_id in self.free_ids:
                self._take(block_id)
            else:
                self.blocks[block_id].ref_count += 1
            if hitting:
                seq.num_cached = end
                seq.block_hashes.append(parent)
            seq.block_table.append(block_id)
        seq.text_kv_upto = seq.num_cached  # a cached block holds every layer's K/V (see _commit)
        self.queried_tokens += len(seq) - 1
        self.hit_tokens += seq.num_cached

    def can_append(self, seq: Sequence, num_tokens: int | None = None) -> bool:
        return self.blocks_needed(num_tokens or len(seq)) - len(seq.block_table) <= self.num_free

    def append(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Grow the table to cover every position of seq, or its first num_tokens (one more block at
        most, in decode; a step launched ahead asks for the position its pending sample will take)."""
        while len(seq.block_table) < self.blocks_needed(num_tokens or len(seq)):
            block_id = self._take()
            self._evict_hash(block_id)
            seq.block_table.append(block_id)

    def commit(self, *seqs: Sequence) -> None:
        """Register the hashes of the sequences' blocks that are full and computed, for later sequences."""
        for seq in seqs:
            self._commit(seq)

    def _commit(self, seq: Sequence) -> None:
        # Only blocks whose tokens the host has (a step launched ahead computes a position whose token is
        # still on the device) and whose K/V are complete in every layer (the text branch's may be pending).
        known = min(seq.num_cached, len(seq), seq.text_kv_upto)
        while (len(seq.block_hashes) + 1) * self.block_size <= known:
            i = len(seq.block_hashes)
            start, end = i * self.block_size, (i + 1) * self.block_size
            text, audio = seq.text_ids[start:end], seq.audio_ids[start:end]
            h = block_hash(seq.block_hashes[-1] if seq.block_hashes else NO_HASH, text, audio)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash == NO_HASH and h not in self.hash_to_block:
                block.hash, block.tokens = h, (tuple(text), tuple(audio))
                self.hash_to_block[h] = block.block_id

    def release(self, block_table: list[int]) -> None:
        """Drop one reference to each block; blocks nobody else holds become free (keeping their
        hashes). The table's tail goes first, so a prefix outlives its tail in the cache."""
        for block_id in reversed(block_table):
            self._release(block_id)

    def reclaim_for_writing(self, block_id: int) -> bool:
        """Make a block its one holder may write into again (a session taking back the partial last block of
        its history from an aborted turn, which filled it): its hash is dropped, so no later lookup finds
        content about to change. False if another sequence also holds it."""
        if self.blocks[block_id].ref_count != 1:
            return False
        self._evict_hash(block_id)
        return True

    def free(self, seq: Sequence) -> None:
        self.release(seq.block_table)
        seq.block_table, seq.block_hashes = [], []
        seq.num_cached = seq.text_kv_upto = 0
