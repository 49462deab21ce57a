"""Paged attention kernels against the gather-then-attend reference of the PyTorch runner.

Without CUDA the kernels run in Triton's CPU interpreter (float32, tiny shapes: a few seconds); with CUDA
every case also runs in bfloat16, plus the real model shape and a decode captured in a CUDA graph and
replayed with new lengths. Pools are poisoned (NaN) wherever a kernel must not read: unowned blocks,
block-table padding and positions past each context; outputs are poisoned before each call.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: it reads this once

triton = pytest.importorskip("triton", reason="triton is not importable; paged attention kernels untested")

from services.llm.model.model import causal_attention  # noqa: E402
from services.llm.runner.kernels.paged_attention import (  # noqa: E402
    MAX_SLICES,
    SMALL_PACKED_ROWS,
    decode_slices,
    paged_decode_attention,
    paged_prefill_attention,
    prefill_block_m,
)

PARTITION = 128  # a round context length for the cases below (two key tiles of a bf16 call)

DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPES = [torch.float32] + ([torch.bfloat16] if CUDA else [])
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
# (query heads, kv heads, head_dim): GQA groups 1, 2 and 4.
SHAPES = [(2, 2, 16), (4, 2, 32), (8, 2, 16)]
LAYERS, LAYER = 3, 2  # attend in the last layer so a wrong layer stride shows


def rng(request) -> torch.Generator:
    """Fresh random inputs per test, reproducible from the test's id (drawn on DEVICE: real-size pools)."""
    return torch.Generator(DEVICE).manual_seed(zlib.crc32(request.node.nodeid.encode()))


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen, device=DEVICE).to(dtype)


def make_pool(gen, ctx_lens, kv_heads, head_dim, dtype, block_size=16):
    """A random pool holding each sequence's context in randomly chosen, distinct blocks.
    → (kv_cache [blocks, LAYERS, 2, KH, bs, D], block_tables [S, max_blocks] int32)."""
    need = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(need) + 2  # + unowned blocks
    kv = randn(gen, num_blocks, LAYERS, 2, kv_heads, block_size, head_dim)
    ids = torch.randperm(num_blocks, generator=gen, device=DEVICE).cpu()
    poison_block = int(ids[-1])
    kv[poison_block] = float("nan")
    tables = torch.full((len(ctx_lens), max(need) + 1), poison_block, dtype=torch.int32)  # padding → NaN block
    first = 0
    for s, (c, n) in enumerate(zip(ctx_lens, need)):
        tables[s, :n] = ids[first : first + n]
        first += n
        if c % block_size:
            kv[tables[s, n - 1], :, :, :, c % block_size :] = float("nan")  # past the context, same block
    return kv.to(dtype), tables.to(DEVICE)


def reference(q, kv, tables, cu, ctx_lens):
    """Per sequence: gather its first ctx positions from the pool (as torch_runner.PagedAttention does),
    then causal GQA attention in float64. ctx 0 (decode padding) → zeros."""
    block_size = kv.shape[4]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for s, c in enumerate(ctx_lens):
        lo, hi = cu[s], cu[s + 1]
        if c == 0 or hi == lo:
            continue
        used = tables[s, : -(-c // block_size)].long()
        k = kv[used, LAYER, 0].permute(0, 2, 1, 3).flatten(0, 1)[:c].double()
        v = kv[used, LAYER, 1].permute(0, 2, 1, 3).flatten(0, 1)[:c].double()
        out[lo:hi] = causal_attention(q[lo:hi].double(), k, v, start=c - (hi - lo))
    return out


def run_decode(gen, ctx_lens, heads, kv_heads, head_dim, dtype, block_size=16, **kw):
    kv, tables = make_pool(gen, ctx_lens, kv_heads, head_dim, dtype, block_size)
    q = randn(gen, len(ctx_lens), heads, head_dim, dtype=dtype)
    lens = torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, kv, LAYER, tables, lens, head_dim**-0.5, out=out, **kw)
    ref = reference(q, kv, tables, list(range(len(ctx_lens) + 1)), ctx_lens)
    return out, ref


def run_prefill(gen, seqs, heads, kv_heads, head_dim, dtype, block_size=16):
    """seqs: (q_len, ctx) per sequence."""
    q_lens, ctx_lens = [n for n, _ in seqs], [c for _, c in seqs]
    kv, tables = make_pool(gen, ctx_lens, kv_heads, head_dim, dtype, block_size)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = randn(gen, cu[-1], heads, head_dim, dtype=dtype)
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(
        q, kv, LAYER, tables, torch.tensor(cu, dtype=torch.int32, device=DEVICE),
        torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE), head_dim**-0.5, out=out,
    )
    return out, reference(q, kv, tables, cu, ctx_lens)


def check(out, ref, dtype):
    assert not out.isnan().any(), "some outputs were not written (or are NaN)"
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim", SHAPES)
def test_decode_ragged_batch(request, dtype, heads, kv_heads, head_dim):
    # Several key tiles (the last one short), one tile + 1 token, context 1, mid-block, whole blocks, and a
    # padding row (ctx 0) → zeros.
    ctx_lens = [2 * PARTITION + 20, 1, 17, 0, PARTITION + 1, 32]
    out, ref = run_decode(rng(request), ctx_lens, heads, kv_heads, head_dim, dtype)
    check(out, ref, dtype)
    assert (out[3] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("slices", [1, 3, MAX_SLICES])
def test_decode_any_slice_count(request, dtype, slices):
    # However a context is cut (one slice written straight to the output, or slices merged; more slices asked
    # for than a short context has tiles), the same attention; a padding row stays zeros.
    ctx_lens = [PARTITION * 3 - 5, 3, 0, 64, 65, PARTITION * 2]
    out, ref = run_decode(rng(request), ctx_lens, 8, 2, 32, dtype, slices=slices)
    check(out, ref, dtype)
    assert (out[2] == 0).all()


def test_decode_slices_fill_the_gpu_and_no_more():
    # About TARGET_PROGRAMS programs: many slices for one sequence, one slice (no merge launched) from 32 sequences
    # of 8 kv heads, never more than MAX_SLICES nor fewer than one.
    assert decode_slices(1, 8) == MAX_SLICES
    assert decode_slices(16, 8) == 2
    assert decode_slices(32, 8) == decode_slices(256, 8) == 1
    assert all(1 <= decode_slices(b, kh) <= MAX_SLICES for b in range(1, 300, 7) for kh in (1, 2, 8))


@pytest.mark.parametrize("block_size", [32, 64])
def test_block_sizes(request, block_size):
    gen = rng(request)
    check(*run_decode(gen, [150, 1, 0], 4, 2, 16, torch.float32, block_size), torch.float32)
    check(*run_prefill(gen, [(20, 150), (1, 33)], 4, 2, 16, torch.float32, block_size), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,kv_heads,head_dim", SHAPES)
def test_prefill_ragged_batch(request, dtype, heads, kv_heads, head_dim):
    seqs = [
        (70, 70),  # plain prefill, longer than a tile of rows
        (1, 45),  # a decode row in the mixed batch
        (5, 150),  # prefix hit: 145 earlier positions only in the pool, ends mid-block
        (0, 10),  # a sequence with no new rows
        (1, 1),  # context 1
        (40, 250),  # long prefix + a chunk spanning several row tiles
    ]
    out, ref = run_prefill(rng(request), seqs, heads, kv_heads, head_dim, dtype)
    check(out, ref, dtype)


@pytest.mark.parametrize("tiles", [None, {"BLOCK_M": 16}, {"BLOCK_M": 64, "BLOCK_N": 16}], ids=str)
def test_prefill_padded_like_a_graph_bucket(request, tiles):
    """A captured prefill replays with N rows and S sequences fixed: padding sequences (q_len 0, ctx 0)
    and rows after the last sequence's are left alone, and any split of the rows is found by the tiles
    (of any height: 4 or 16 positions a tile at this group of 4)."""
    gen = rng(request)
    heads, kv_heads, head_dim = 8, 2, 16
    seqs = [(1, 30)] * 9 + [(37, 37), (1, 3), (20, 70)] + [(0, 0)] * 4  # 4 padding sequences
    q_lens, ctx_lens = [n for n, _ in seqs], [c for _, c in seqs]
    kv, tables = make_pool(gen, ctx_lens, kv_heads, head_dim, torch.float32)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = randn(gen, cu[-1] + 11, heads, head_dim)  # 11 padding rows
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(q, kv, LAYER, tables, torch.tensor(cu, dtype=torch.int32, device=DEVICE),
                            torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE), head_dim**-0.5, out=out,
                            tiles=tiles)
    check(out[: cu[-1]], reference(q[: cu[-1]], kv, tables, cu, ctx_lens), torch.float32)
    assert out[cu[-1] :].isnan().all(), "a padding row was written"


@pytest.mark.parametrize("rows", [[1] * 12, [12], [1] * 10 + [2]], ids=["decode rows", "one prompt", "both"])
def test_prefill_searches_only_the_sequences_that_can_have_rows(request, rows):
    """A graph pads the sequences far beyond the rows (256 against 16-64 in a mixed step); the call searches only
    the first min(S, N): with every row its own sequence (N of them have rows) and with one sequence holding them
    all, every row is still found, and the padding sequences' rows are never written."""
    gen = rng(request)
    heads, kv_heads, head_dim = 8, 2, 16
    seqs = [(n, 40 + 3 * i) for i, n in enumerate(rows)] + [(0, 0)] * 30
    q_lens, ctx_lens = [n for n, _ in seqs], [c for _, c in seqs]
    kv, tables = make_pool(gen, ctx_lens, kv_heads, head_dim, torch.float32)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = randn(gen, cu[-1], heads, head_dim)
    out = torch.full_like(q, float("nan"))
    paged_prefill_attention(q, kv, LAYER, tables, torch.tensor(cu, dtype=torch.int32, device=DEVICE),
                            torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE), head_dim**-0.5, out=out)
    check(out, reference(q, kv, tables, cu, ctx_lens), torch.float32)


def test_small_packed_calls_take_the_smallest_tile_that_holds_a_group():
    assert prefill_block_m(64, 4, 64) == 16          # a mixed step at the real group (32 heads over 8)
    assert prefill_block_m(SMALL_PACKED_ROWS, 32, 64) == 32
    assert prefill_block_m(SMALL_PACKED_ROWS + 1, 4, 64) == 64  # a prompt's prefill keeps the tall tile


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_chunked_equals_one_pass(request, dtype):
    gen = rng(request)
    heads, kv_heads, head_dim, total, split = 8, 2, 16, 150, 90
    kv, tables = make_pool(gen, [total], kv_heads, head_dim, dtype)
    q = randn(gen, total, heads, head_dim, dtype=dtype)

    def prefill(rows, ctx):
        out = torch.full_like(rows, float("nan"))
        cu = torch.tensor([0, rows.shape[0]], dtype=torch.int32, device=DEVICE)
        ctx = torch.tensor([ctx], dtype=torch.int32, device=DEVICE)
        return paged_prefill_attention(rows, kv, LAYER, tables, cu, ctx, head_dim**-0.5, out=out)

    one_pass = prefill(q, total)
    chunked = torch.cat([prefill(q[:split], split), prefill(q[split:], total)])
    check(one_pass, reference(q, kv, tables, [0, total], [total]), dtype)
    torch.testing.assert_close(chunked, one_pass, **TOL[dtype])


def test_prefill_of_single_rows_equals_decode(request):
    gen = rng(request)
    heads, kv_heads, head_dim = 8, 2, 16
    ctx_lens = [PARTITION + 60, 1, 47, 16]
    kv, tables = make_pool(gen, ctx_lens, kv_heads, head_dim, torch.float32)
    q = randn(gen, len(ctx_lens), heads, head_dim)
    lens = torch.tensor(ctx_lens, dtype=torch.int32, device=DEVICE)
    cu = torch.arange(len(ctx_lens) + 1, dtype=torch.int32, device=DEVICE)
    decode = paged_decode_attention(q, kv, LAYER, tables, lens, head_dim**-0.5)
    prefill = paged_prefill_attention(q, kv, LAYER, tables, cu, lens, head_dim**-0.5)
    torch.testing.assert_close(prefill, decode, **TOL[torch.float32])


@pytest.mark.skipif(not CUDA, reason="needs CUDA: real model shape")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_real_shape(request, dtype):
    gen = rng(request)
    heads, kv_heads, head_dim = 32, 8, 128
    ctx_lens = torch.randint(1, 4097, (64,), generator=gen, device=DEVICE).tolist()
    ctx_lens[:4] = [4096, 1, 2048, 0]
    check(*run_decode(gen, ctx_lens, heads, kv_heads, head_dim, dtype), dtype)  # 64 sequences: one slice each
    check(*run_decode(gen, ctx_lens[:4], heads, kv_heads, head_dim, dtype), dtype)  # 4: eight slices, merged
    seqs = [(1024, 4096), (1, 3000), (700, 700), (1, 1), (333, 2049), (17, 17)]
    check(*run_prefill(gen, seqs, heads, kv_heads, head_dim, dtype), dtype)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: CUDA graphs")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("slices", [None, 1])
def test_decode_cuda_graph_replays_with_new_lengths(request, dtype, slices):
    # Captured at context 5, replayed at others: each slice's length follows its sequence's context.
    gen = rng(request)
    heads, kv_heads, head_dim, batch, max_context = 32, 8, 128, 8, 2048
    kv, tables = make_pool(gen, [max_context] * batch, kv_heads, head_dim, dtype)
    q = randn(gen, batch, heads, head_dim, dtype=dtype)
    lens = torch.full((batch,), 5, dtype=torch.int32, device=DEVICE)
    out = torch.empty_like(q)

    def step():
        paged_decode_attention(q, kv, LAYER, tables, lens, head_dim**-0.5, out=out, slices=slices)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for new_lens in ([1, 2048, 17, 0, 129, 1000, 0, 64], [2048, 3, 0, 0, 511, 1, 1500, 2000]):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(randn(gen, *q.shape))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, reference(q, kv, tables, list(range(batch + 1)), new_lens), dtype)
