"""Block manager: reference counts, full-block hashing, what may hit and when."""

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.block_manager import BlockManager
from services.llm.sequence import Sequence


def seq_of(text: list[int], request_id: str = "r") -> Sequence:
    return Sequence(request_id, list(text), [512] * len(text), SamplingSettings(), ChunkSettings(), True)


def computed(bm: BlockManager, seq: Sequence) -> None:
    """As if the runner had computed every position of seq."""
    seq.num_cached = seq.text_kv_upto = len(seq)  # every layer, both branches
    bm.commit(seq)


def test_allocate_covers_every_position_and_free_returns_blocks():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = seq_of(list(range(10)))
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == 3 and bm.num_used == 3 and seq.num_cached == 0
    bm.free(seq)
    assert bm.num_used == 0 and seq.block_table == []


def test_shared_prefix_hits_only_after_it_was_computed():
    bm = BlockManager(num_blocks=20, block_size=4)
    first = seq_of(list(range(13)), "a")
    bm.allocate(first)
    second = seq_of(list(range(12)) + [99], "b")
    bm.allocate(second)  # first not computed yet: nothing to share
    assert second.num_cached == 0 and set(second.block_table).isdisjoint(first.block_table)
    bm.free(second)
    computed(bm, first)
    third = seq_of(list(range(12)) + [99], "c")
    bm.allocate(third)
    assert third.num_cached == 12 and third.block_table[:3] == first.block_table[:3]
    assert all(bm.blocks[b].ref_count == 2 for b in first.block_table[:3])
    assert bm.hit_tokens == 12
    bm.free(first)
    assert all(bm.blocks[b].ref_count == 1 for b in third.block_table[:3])
    bm.free(third)
    assert bm.num_used == 0


def test_freed_blocks_keep_their_contents_until_reused():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq_of(list(range(9)), "a")
    bm.allocate(a)
    computed(bm, a)
    table = list(a.block_table)
    bm.free(a)
    again = seq_of(list(range(9)), "a2")
    bm.allocate(again)
    assert again.num_cached == 8 and again.block_table[:2] == table[:2]


def test_the_last_position_is_always_computed():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq_of(list(range(8)))
    bm.allocate(a)
    computed(bm, a)
    same = seq_of(list(range(8)), "b")
    bm.allocate(same)
    assert same.num_cached == 4  # the second block holds the last position: recomputed, in a block of its own
    assert same.block_table[1] != a.block_table[1]


def test_a_different_earlier_block_breaks_the_chain():
    bm = BlockManager(num_blocks=12, block_size=4)
    a = seq_of(list(range(12)))
    bm.allocate(a)
    computed(bm, a)
    b = seq_of([100] + list(range(1, 12)) + [7], "b")  # same second block, different first
    bm.allocate(b)
    assert b.num_cached == 0


def test_reused_free_block_loses_its_old_hash():
    bm = BlockManager(num_blocks=3, block_size=4)
    a = seq_of(list(range(9)), "a")
    bm.allocate(a)
    computed(bm, a)
    bm.free(a)
    b = seq_of([50 + i for i in range(12)], "b")  # needs all 3 blocks: overwrites a's
    bm.allocate(b)
    bm.free(b)
    c = seq_of(list(range(9)), "c")
    bm.allocate(c)
    assert c.num_cached == 0
