"""The encoder's layers over a layout padded to a CUDA graph's bucket (services/encoder/graphs.py): the padding rows
touch only the scratch slot, the surplus attention programs do nothing, and the call's rows come out as the eager
layers give them. On the CPU the padded layout runs eagerly with the attention kernel in Triton's interpreter; with
CUDA the captured graphs are replayed against the eager model, call after call."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not importable; the encoder's graph layout untested")

from services.encoder import attention  # noqa: E402
from services.encoder.attention import Layout  # noqa: E402
from services.encoder.config import tiny  # noqa: E402
from services.encoder.graphs import PaddedLayout  # noqa: E402
from services.encoder.kv_pool import KVPool  # noqa: E402
from services.encoder.whisper_vq import WhisperVQEncoder  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return WhisperVQEncoder(tiny()).eval().to(DEVICE)


def lay_out(counts: list[int], past: list[int]) -> tuple[list[int], list[int]]:
    rows, at = [], 0
    for t in counts:
        rows.append(at)
        at += t
    return rows, past


@torch.no_grad()
@pytest.mark.parametrize("counts,past,bucket", [
    ([5], [0], 8),                        # one stream's first chunk, three padding rows
    ([34, 0, 1, 7], [2, 9, 38, 0], 64),   # rows past a block, a stream of none, a long past; 22 padding rows
    ([2, 2, 2], [10, 20, 30], 6),         # a full bucket: no padding row
])
def test_padded_layers_give_the_eager_layers_rows_and_write_only_the_scratch_slot(model, monkeypatch, counts, past,
                                                                                  bucket):
    monkeypatch.setattr(attention, "attend", attention.kernel)  # (the kernel's own layout on the CPU too)
    cfg, slots = model.cfg, [3, 0, 2, 1][: len(counts)]
    g = torch.Generator(DEVICE).manual_seed(sum(counts))
    eager_pool = KVPool(cfg, 4, DEVICE, scratch=True)
    eager_pool.k.normal_(generator=g)
    eager_pool.v.normal_(generator=g)
    padded_pool = KVPool(cfg, 4, DEVICE, scratch=True)
    padded_pool.k.copy_(eager_pool.k)
    padded_pool.v.copy_(eager_pool.v)
    n = sum(counts)
    x = torch.randn(n, cfg.d_model, generator=g, device=DEVICE)
    rows, past = lay_out(counts, past)
    want = model._layers(x, Layout(slots, rows, counts, past, x.device), eager_pool)

    layout = PaddedLayout(64, max_streams=5, scratch=padded_pool.scratch, device=DEVICE)
    static = layout.fill(slots, rows, counts, past, bucket)
    assert static.num_blocks == bucket // attention.BLOCK_M + min(bucket, 5)
    x_padded = torch.cat([x, torch.full((bucket - n, cfg.d_model), 7.0, device=DEVICE)])
    got = model._layers(x_padded, static, padded_pool)
    torch.testing.assert_close(got[:n], want, rtol=1e-4, atol=1e-4)
    real = slice(0, padded_pool.scratch)
    torch.testing.assert_close(padded_pool.k[:, real], eager_pool.k[:, real], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(padded_pool.v[:, real], eager_pool.v[:, real], rtol=1e-4, atol=1e-4)
    scratch_touched = not torch.equal(padded_pool.k[:, padded_pool.scratch], eager_pool.k[:, eager_pool.scratch])
    assert scratch_touched == (bucket > n)


def test_the_scratch_slot_is_never_a_speakers():
    pool = KVPool(tiny(), 2, scratch=True)
    taken = {pool.take(), pool.take()}
    assert pool.scratch not in taken and pool.used() == 2 and pool.k.shape[1] == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the device)")
@torch.no_grad()
def test_graph_replays_give_the_eager_codes_call_after_call():
    """Streams of uneven chunks fed call after call through the captured graphs (padding, several buckets, a call
    too big for any: eager), against the same streams through the eager layers: the same codes."""
    torch.manual_seed(0)
    model = WhisperVQEncoder(tiny()).eval().cuda()
    cfg = model.cfg
    graphed_pool = KVPool(cfg, 4, torch.device("cuda"), scratch=True)
    eager_pool = KVPool(cfg, 4, torch.device("cuda"))
    g = torch.Generator().manual_seed(1)
    chunks = [[3, 10, 0, 7, 50], [16, 1, 2, 2, 9], [0, 0, 3, 4, 40]]
    mels = [torch.randn(cfg.num_mel_bins, sum(c), generator=g).cuda() for c in chunks]
    got = {}
    for pool, graphs in ((eager_pool, False), (graphed_pool, True)):
        model.graphs = None
        if graphs:
            model.capture(pool, max_streams=4, buckets=(8, 16, 32))
        states, codes, at = [model.start(pool) for _ in chunks], [[] for _ in chunks], [0] * len(chunks)
        for step in range(5):
            parts = []
            for i, c in enumerate(chunks):
                parts.append(mels[i][:, at[i] : at[i] + c[step]])
                at[i] += c[step]
            for i, new in enumerate(model.feed(states, parts, pool)):
                codes[i].append(new)
        got[graphs] = [torch.cat([*c, model.finish(s, pool)]).tolist() for c, s in zip(codes, states)]
        if graphs:
            assert model.graphs.replays == 4  # the fifth call's 60 rows fit no bucket of these
    model.graphs = None
    assert got[True] == got[False]
