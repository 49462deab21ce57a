"""KV-cache blocks: reference-counted, with computed blocks known by their contents for prefix reuse.

A block holds `block_size` positions of K and V for all 40 layers (docs/architecture.md §3); a sequence's
block table lists its blocks in position order. A full block is known by a hash chained over every
(text, audio) pair from the sequence start through the block, so two sequences that agree on a prefix
(the system prompt, a session's history, a preempted request coming back) share those blocks.

A block's hash is registered only once its K/V have been computed (`commit`), so a lookup never finds a
block that a chunked prefill has not written yet. Its text branch's K/V may be missing for some positions
(the kernel runner leaves the text branch out while a sequence speaks and fills it in when it next samples
text): each block records how many of its leading positions have them (`text_upto`), and a sequence that
hits it starts with those (`Sequence.text_kv_upto`), the rest filled in from the trunk outputs the block keeps.

The partly filled last block of a session's turn is known too (`keep_partial`): its computed positions, after
the hash of the full blocks before it. A later sequence that starts with the same positions gets a copy of it
(`take_copies`: the runner copies the block before the step that writes the rest), so the block it was copied
from never changes under its holder. A freed block keeps its hash and contents until it is handed out again,
so recently freed prefixes still hit. Free blocks are reused oldest-freed first.
"""

from __future__ import annotations

from collections import OrderedDict

from services.llm.sequence import Sequence

NO_HASH = -1


def block_hash(parent: int, text: list[int], audio: list[int]) -> int:
    # Python's hash of a tuple of ints is deterministic (no per-process salt for ints).
    return hash((parent, tuple(text), tuple(audio)))


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "tokens", "text_upto", "partial_after")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = NO_HASH
        self.tokens: tuple | None = None  # (text, audio) of a known block, checked on every hit
        self.text_upto = 0                # of a known block: its leading positions whose text-branch K/V are in
        self.partial_after: int | None = None  # a known partial block: the hash of the full blocks before it


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # oldest freed first
        self.hash_to_block: dict[int, int] = {}
        self.partials: dict[int, set[int]] = {}  # hash of the full blocks before → known partial blocks after them
        self.copies: list[tuple[int, int]] = []  # (source, destination) blocks the runner copies before the next step
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

    def _hold(self, block_id: int) -> None:
        """One more reference to a block, free or not."""
        if block_id in self.free_ids:
            self._take(block_id)
        else:
            self.blocks[block_id].ref_count += 1

    def _fresh(self) -> int:
        """A free block to write into: whatever it was known as is forgotten."""
        block_id = self._take()
        self._forget(block_id)
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_ids[block_id] = None

    def _forget(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.hash != NO_HASH and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]
        if block.partial_after is not None:
            self.partials[block.partial_after].discard(block_id)
            if not self.partials[block.partial_after]:
                del self.partials[block.partial_after]
        block.hash, block.tokens, block.text_upto, block.partial_after = NO_HASH, None, 0, None

    # ---- the protocol ----------------------------------------------------------------------------
    def can_allocate(self, seq: Sequence) -> bool:
        """Room for every position of seq (cache hits not counted on)."""
        return self.blocks_needed(len(seq)) <= self.num_free

    def allocate(self, seq: Sequence) -> None:
        """Give a sequence that holds no blocks a table covering all its positions, reusing the known blocks of
        its longest known prefix: full blocks shared, then a known partial block copied into its own. Sets
        seq.num_cached (positions that hit) and seq.text_kv_upto (those of them whose text-branch K/V are in).

        Only positions before the last may hit: that position must be computed to give the next token's logits."""
        size, last = self.block_size, len(seq) - 1
        parent, text_upto = NO_HASH, 0
        while (len(seq.block_table) + 1) * size <= last:
            start = len(seq.block_table) * size
            text, audio = seq.text_ids[start : start + size], seq.audio_ids[start : start + size]
            h = block_hash(parent, text, audio)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].tokens != (tuple(text), tuple(audio)):
                break  # a miss (or a hash collision: the same)
            self._hold(block_id)
            seq.block_table.append(block_id)
            seq.block_hashes.append(parent := h)
            if text_upto == start:  # text K/V are in up to here: this block's come on top
                text_upto += self.blocks[block_id].text_upto
        seq.num_cached = len(seq.block_table) * size
        source = self._partial_hit(parent, seq)
        fresh = self.blocks_needed(len(seq)) - len(seq.block_table)
        if source is not None and source in self.free_ids and self.num_free <= fresh:
            source = None  # held, it would take a block the sequence needs
        if source is not None:
            self._hold(source)  # until the runner has copied it (take_copies); not handed out meanwhile
        for _ in range(fresh):
            seq.block_table.append(self._fresh())
        if source is not None:
            block = self.blocks[source]
            self.copies.append((source, seq.block_table[seq.num_cached // size]))
            if text_upto == seq.num_cached:
                text_upto += block.text_upto
            seq.num_cached += len(block.tokens[0])
        seq.text_kv_upto = text_upto
        self.queried_tokens += last
        self.hit_tokens += seq.num_cached

    def _partial_hit(self, parent: int, seq: Sequence) -> int | None:
        """The longest known partial block after `parent` whose positions seq continues with, leaving its last
        position to compute; None if there is none."""
        start, best, most = seq.num_cached, None, 0
        for block_id in self.partials.get(parent, ()):
            text, audio = self.blocks[block_id].tokens
            n = len(text)
            if most < n and start + n <= len(seq) - 1 and seq.text_ids[start : start + n] == list(text) \
                    and seq.audio_ids[start : start + n] == list(audio):
                best, most = block_id, n
        return best

    def take_copies(self) -> list[tuple[int, int]]:
        """The block copies to run before the next step's forward, (source, destination) each. Taking them lets go
        of the sources: the copies run on the device ahead of anything that could write there later."""
        copies, self.copies = self.copies, []
        for source, _ in copies:
            self._release(source)
        return copies

    def can_append(self, seq: Sequence, num_tokens: int | None = None) -> bool:
        return self.blocks_needed(num_tokens or len(seq)) - len(seq.block_table) <= self.num_free

    def append(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Grow the table to cover every position of seq, or its first num_tokens (one more block at
        most, in decode; a step launched ahead asks for the position its pending sample will take)."""
        while len(seq.block_table) < self.blocks_needed(num_tokens or len(seq)):
            seq.block_table.append(self._fresh())

    def commit(self, *seqs: Sequence) -> None:
        """Make the sequences' full, computed blocks known to later sequences, with how far their text-branch
        K/V are in."""
        for seq in seqs:
            self._commit(seq)

    def _commit(self, seq: Sequence) -> None:
        # Only blocks whose tokens the host has (a step launched ahead computes a position whose token is
        # still on the device).
        known, size = min(seq.num_cached, len(seq)), self.block_size
        if seq.text_kv_upto > seq.text_committed:  # text K/V filled in since (not every step: a speaking one's stay)
            for i in range(seq.text_committed // size, len(seq.block_hashes)):
                self._mark_text(seq.block_table[i], seq.block_hashes[i], i * size, seq.text_kv_upto)
        while (len(seq.block_hashes) + 1) * size <= known:
            i = len(seq.block_hashes)
            start, end = i * size, (i + 1) * size
            text, audio = seq.text_ids[start:end], seq.audio_ids[start:end]
            h = block_hash(seq.block_hashes[-1] if seq.block_hashes else NO_HASH, text, audio)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash == NO_HASH and h not in self.hash_to_block:
                block.hash, block.tokens = h, (tuple(text), tuple(audio))
                self.hash_to_block[h] = block.block_id
            self._mark_text(block.block_id, h, start, seq.text_kv_upto)
        seq.text_committed = min(seq.text_kv_upto, len(seq.block_hashes) * size)

    def _mark_text(self, block_id: int, h: int, start: int, text_kv_upto: int) -> None:
        """A holder of the known block `h` at `block_id` has its text-branch K/V up to text_kv_upto."""
        block = self.blocks[block_id]
        if block.hash == h:
            block.text_upto = max(block.text_upto, min(self.block_size, max(0, text_kv_upto - start)))

    def keep_partial(self, seq: Sequence) -> None:
        """Make the computed positions of seq's partly filled last block known (a session's turn that ended: its
        next turn starts with them), after the hash of its full blocks. Never written again: a sequence that hits
        it gets a copy."""
        size = self.block_size
        i, n = seq.num_cached // size, seq.num_cached % size
        if not n or len(seq.block_hashes) != i or i >= len(seq.block_table):
            return  # no partial block (or its full blocks are not all known)
        block = self.blocks[seq.block_table[i]]
        start = i * size
        self._forget(block.block_id)
        block.tokens = (tuple(seq.text_ids[start : start + n]), tuple(seq.audio_ids[start : start + n]))
        block.text_upto = min(n, max(0, seq.text_kv_upto - start))
        block.partial_after = seq.block_hashes[-1] if i else NO_HASH
        self.partials.setdefault(block.partial_after, set()).add(block.block_id)

    def release(self, block_table: list[int]) -> None:
        """Drop one reference to each block; blocks nobody else holds become free (keeping what they are known
        as). The table's tail goes first, so a prefix outlives its tail in the cache."""
        for block_id in reversed(block_table):
            self._release(block_id)

    def detach(self, seq: Sequence) -> list[int]:
        """seq's block table, its references now the caller's; seq holds no block after."""
        table = seq.block_table
        seq.block_table, seq.block_hashes = [], []
        seq.num_cached = seq.text_kv_upto = seq.text_committed = 0
        return table

    def free(self, seq: Sequence) -> None:
        self.release(self.detach(seq))
