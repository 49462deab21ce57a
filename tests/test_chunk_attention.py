"""The estimator's attention kernel (codec/chunk_attention.py) against its PyTorch form: static chunks, rows of
fewer valid frames, a prompt prefix read by each row's voice; q, k and v strided as the estimator makes them.
Without CUDA the kernel runs in Triton's CPU interpreter (float32, small shapes); with CUDA also in bfloat16 at
the real size. The graph's output is poisoned before its replay."""

from __future__ import annotations

import math

import pytest
import torch

CUDA = torch.cuda.is_available()
pytest.importorskip("triton", reason="triton is not importable; the codec attention kernel untested")

from services.vocoder.codec import chunk_attention  # noqa: E402
from services.vocoder.codec.chunk_attention import kernel, reference  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")


def qkv(gen, B, H, T, d, dtype):
    """q, k, v [B, H, T, d] as views of one [B, T, 3, H, d] projection (the estimator's strides)."""
    x = torch.randn(B, T, 3, H, d, generator=gen, device=DEVICE).to(dtype)
    return x.permute(2, 0, 3, 1, 4).unbind(0)


CASES = [  # (B, H, T, d, chunk, prefix frames, prompt voices)
    (3, 2, 37, 16, 4, 0, 0),
    (3, 2, 37, 16, 0, 0, 0),
    (4, 2, 29, 16, 4, 8, 2),
    (2, 1, 70, 32, 20, 40, 3),
]


# the keys in one walk (tiles()'s choice here), or in parts side by side, then combined: the prefix in one or two spans
PARTS = [None, dict(BLOCK_M=16, BLOCK_N=16, PARTS=3), dict(BLOCK_M=16, BLOCK_N=16, PARTS=4)]


@pytest.mark.parametrize("config", PARTS)
@pytest.mark.parametrize("B,H,T,d,chunk,frames,voices", CASES)
def test_kernel_is_the_pytorch_form(B, H, T, d, chunk, frames, voices, config):
    gen = torch.Generator(DEVICE).manual_seed(B * 1000 + T)
    for dtype in [torch.float32] + ([torch.bfloat16] if CUDA else []):
        q, k, v = qkv(gen, B, H, T, d, dtype)
        lengths = torch.randint(1, T + 1, (B,), generator=gen, device=DEVICE).to(torch.int32)
        lengths[0] = T  # one whole row
        prefix = None
        if frames:
            pk, pv = (torch.randn(2 * voices, H, frames, d, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
            prefix = (pk, pv, torch.randint(0, 2 * voices, (B,), generator=gen, device=DEVICE))
        want = reference(q, k, v, lengths, chunk, prefix).float()
        got = kernel(q, k, v, lengths, chunk, prefix, config).float()
        assert got.shape == (B, T, H * d) and torch.isfinite(got).all()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("config", PARTS)
def test_a_row_of_no_frames_reads_only_its_prefix(config):
    """After the prompt prefix, a padding row may have no valid frame: it reads the prefix alone, finite."""
    gen = torch.Generator(DEVICE).manual_seed(5)
    q, k, v = qkv(gen, 2, 2, 16, 16, torch.float32)
    lengths = torch.tensor([16, 0], dtype=torch.int32, device=DEVICE)
    pk, pv = (torch.randn(2, 2, 8, 16, generator=gen, device=DEVICE) for _ in range(2))
    rows = torch.tensor([0, 1], device=DEVICE)
    got = kernel(q, k, v, lengths, 4, (pk, pv, rows), config)
    torch.testing.assert_close(got, reference(q, k, v, lengths, 4, (pk, pv, rows)), atol=1e-5, rtol=1e-5)
    alone = torch.softmax(q[1] @ pk[1].transpose(1, 2) / 4, -1) @ pv[1]       # [H, T, d]: the prefix only
    torch.testing.assert_close(got[1].view(16, 2, 16).transpose(0, 1), alone, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not CUDA, reason="the real size in bfloat16: needs a GPU")
def test_real_size_in_a_cuda_graph():
    """32 rows, 8 heads, 180 frames after a 140-frame prefix of 2 voices, captured in a CUDA graph and replayed."""
    gen = torch.Generator(DEVICE).manual_seed(7)
    q, k, v = qkv(gen, 32, 8, 180, 64, torch.bfloat16)
    lengths = torch.randint(100, 181, (32,), generator=gen, device=DEVICE).to(torch.int32)
    pk, pv = (torch.randn(4, 8, 140, 64, generator=gen, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    rows = torch.randint(0, 4, (32,), generator=gen, device=DEVICE)
    kernel(q, k, v, lengths, 20, (pk, pv, rows))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel(q, k, v, lengths, 20, (pk, pv, rows))
    out.fill_(float("nan"))
    graph.replay()
    torch.testing.assert_close(out.float(), reference(q, k, v, lengths, 20, (pk, pv, rows)).float(), atol=2e-2, rtol=2e-2)


HISTORY_CASES = [  # (B, H, T, d, chunk, prefix frames, ring)
    (3, 2, 29, 16, 4, 8, 12),
    (2, 2, 40, 16, 20, 0, 40),
]


# and the small tile that calls of 6 streams or more take (tiles(): one warp, the max kept lazily: scores in base 2,
# the output rescaled only past 2^8)
@pytest.mark.parametrize("config", PARTS + [dict(chunk_attention.SMALL_TILE, PARTS=1)])
@pytest.mark.parametrize("B,H,T,d,chunk,frames,ring", HISTORY_CASES)
def test_history_kernel_is_the_pytorch_form(B, H, T, d, chunk, frames, ring, config):
    """Rows reading a prefix, then a stream's kept frames (a full ring, a part-filled one, none), then their own
    by the chunk rule; the ring is read, not written."""
    gen = torch.Generator(DEVICE).manual_seed(T + ring)
    for dtype in [torch.float32] + ([torch.bfloat16] if CUDA else []):
        q, k, v = qkv(gen, B + 1, H, T, d, dtype)
        lengths = torch.tensor([T, 7, 0][: B] + [5], dtype=torch.int32, device=DEVICE)
        prefix = None
        if frames:
            pk, pv = (torch.randn(4, H, frames, d, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
            prefix = (pk, pv, torch.tensor([0, 3, 1, 2][: B + 1], device=DEVICE))
        hk, hv = (torch.randn(6, H, ring, d, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
        history = (hk, hv, torch.tensor([2, 0, 4, 1][: B + 1], device=DEVICE),
                   torch.tensor([ring, 5, 0, 3][: B + 1], device=DEVICE))
        before = hk.clone()
        want = reference(q, k, v, lengths, chunk, prefix, history).float()
        got = kernel(q, k, v, lengths, chunk, prefix, config, history).float()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert torch.isfinite(got).all() and torch.equal(hk, before)
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        without = reference(q, k, v, lengths, chunk, prefix).float()
        assert not torch.allclose(got[0], without[0], atol=1e-3)                 # the kept frames were read


def test_few_programs_read_their_keys_in_parts(monkeypatch):
    """tiles(): a steady call of a few streams (6 rows, 8 heads, 80 frames after 140 prefix frames and a ring of 40)
    reads its keys in 4 parts; 12 rows and more (enough programs to fill a GPU), a first call, or no keys before the
    row's own, in one walk."""
    assert chunk_attention.tiles(6, 8, 80, 180)["PARTS"] == 4
    assert chunk_attention.tiles(2, 8, 80, 180)["PARTS"] == 4          # one stream
    assert chunk_attention.tiles(2, 8, 40, 140)["PARTS"] == 1          # a stream's first call: a few blocks of keys
    assert chunk_attention.tiles(12, 8, 80, 180)["PARTS"] == 1
    assert chunk_attention.tiles(64, 8, 80, 180)["PARTS"] == 1
    assert chunk_attention.tiles(2, 8, 192, 0)["PARTS"] == 1           # a first block alone: no prefix
    monkeypatch.setattr(chunk_attention, "SPLIT", False)
    assert chunk_attention.tiles(6, 8, 80, 180)["PARTS"] == 1


def test_calls_of_6_streams_or_more_with_a_history_take_the_small_tile(monkeypatch):
    """tiles(): from 6 streams (12 rows x 8 heads) a steady call with a history takes the small tile: 16 x 16 with one
    warp, the max kept lazily, at most 96 registers a thread; 3 streams, or no history, as before."""
    small = dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, LAZY=True, maxnreg=96, PARTS=1, CASCADE=False)
    assert chunk_attention.tiles(64, 8, 80, 180, history=True) == small
    assert chunk_attention.tiles(12, 8, 80, 180, history=True) == small
    assert chunk_attention.tiles(6, 8, 80, 180, history=True) != small
    assert chunk_attention.tiles(64, 8, 80, 180) != small
    monkeypatch.setattr(chunk_attention, "SMALL_TILES_FROM", 0)
    assert chunk_attention.tiles(64, 8, 80, 180, history=True) != small


def test_parts_it_cannot_split_into_are_refused():
    gen = torch.Generator(DEVICE).manual_seed(1)
    q, k, v = qkv(gen, 1, 1, 16, 16, torch.float32)
    lengths = torch.tensor([16], dtype=torch.int32, device=DEVICE)
    for parts in (0, 2):
        with pytest.raises(ValueError, match="PARTS"):
            kernel(q, k, v, lengths, 4, None, dict(BLOCK_M=16, BLOCK_N=16, PARTS=parts))
    with pytest.raises(ValueError, match="LAZY"):  # parts are combined in natural units
        kernel(q, k, v, lengths, 4, None, dict(BLOCK_M=16, BLOCK_N=16, PARTS=3, LAZY=True))


@pytest.mark.parametrize("rise", [0.0, 3.0, 200.0], ids=["flat", "within 2^8", "far past 2^8"])
def test_a_max_kept_lazily_rescales_when_a_later_block_passes_it(rise):
    """Later blocks of keys whose scores rise by `rise` (in base 2, over the walk) past the first block's: within 2^8
    the output is summed against the kept max; far past it (2^200: float32's exp2 would overflow against a max kept
    from the first block) rescaled mid-walk. Either way PyTorch's result, and the same as the walk that rescales every
    block. With a prefix and a ring, so that all three walks take the lazy step."""
    gen = torch.Generator(DEVICE).manual_seed(11)
    B, H, T, d, frames, ring = 2, 2, 48, 16, 40, 24
    q, k, v = qkv(gen, B, H, T, d, torch.float32)
    lengths = torch.tensor([T, 30], dtype=torch.int32, device=DEVICE)
    # every query near one unit direction a row and head, and keys along it whose base-2 scores grow from 0 to `rise`
    # over the walk: the prefix's first, then the ring's, then the row's own
    direction = torch.randn(B, H, 1, d, generator=gen, device=DEVICE)
    direction = direction / direction.norm(dim=-1, keepdim=True)                        # [B, H, 1, d]
    q = direction + 0.05 * q
    grow = torch.linspace(0.0, 1.0, frames + ring + T, device=DEVICE) * rise / math.log2(math.e) * math.sqrt(d)
    pk, pv = (torch.randn(2, H, frames, d, generator=gen, device=DEVICE) for _ in range(2))
    hk, hv = (torch.randn(B, H, ring, d, generator=gen, device=DEVICE) for _ in range(2))
    pk = pk * 0.1 + direction[:1] * grow[:frames, None]
    hk = hk * 0.1 + direction * grow[frames:frames + ring, None]
    k = k * 0.1 + direction * grow[frames + ring:, None]
    prefix = (pk.contiguous(), pv, torch.zeros(B, dtype=torch.long, device=DEVICE))
    history = (hk, hv, torch.arange(B, device=DEVICE), torch.full((B,), ring, device=DEVICE))
    want = reference(q, k, v, lengths, 8, prefix, history)
    eager = kernel(q, k, v, lengths, 8, prefix, dict(BLOCK_M=16, BLOCK_N=16, PARTS=1), history)
    lazy = kernel(q, k, v, lengths, 8, prefix, dict(BLOCK_M=16, BLOCK_N=16, PARTS=1, LAZY=True), history)
    tol = 1e-5 if rise < 100 else 1e-3  # (scores of ~140 hold float32's sums to ~1e-5 of them, whichever max)
    torch.testing.assert_close(lazy, want, atol=tol, rtol=tol)
    torch.testing.assert_close(lazy, eager, atol=tol, rtol=tol)


@pytest.mark.parametrize("with_history", [True, False], ids=["ring", "no ring"])
def test_the_prefix_read_once_per_voice_is_the_pytorch_form(with_history):
    """CASCADE: every row's queries against its voice's prefix in blocks of 64 queries across rows (a block over two
    rows of one prefix row, over two of different ones), then the ring and the row's own keys, merged."""
    gen = torch.Generator(DEVICE).manual_seed(11)
    B, H, T, d, ring = 5, 2, 70, 16, 12
    config = dict(BLOCK_M=16, BLOCK_N=16, PARTS=1, CASCADE=True)
    for dtype in [torch.float32] + ([torch.bfloat16] if CUDA else []):
        q, k, v = qkv(gen, B, H, T, d, dtype)
        lengths = torch.tensor([T, 33, 0, T, 7], dtype=torch.int32, device=DEVICE)
        pk, pv = (torch.randn(4, H, 24, d, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
        prefix = (pk, pv, torch.tensor([0, 0, 1, 3, 3], device=DEVICE))
        history = None
        if with_history:
            hk, hv = (torch.randn(6, H, ring, d, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
            history = (hk, hv, torch.tensor([2, 0, 4, 1, 5], device=DEVICE),
                       torch.tensor([ring, 5, 0, 3, ring], device=DEVICE))
        want = reference(q, k, v, lengths, 20, prefix, history).float()
        got = kernel(q, k, v, lengths, 20, prefix, config, history).float()
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="CASCADE"):
        kernel(*qkv(gen, 2, H, 40, d, torch.float32), torch.tensor([40, 40], dtype=torch.int32, device=DEVICE), 20,
               (pk.float(), pv.float(), torch.tensor([0, 1], device=DEVICE)), config)


def test_steady_calls_of_16_streams_and_more_read_the_prefix_once_per_voice_when_asked(monkeypatch):
    """Off by default (measured slower); from CASCADE_FROM rows x heads with a history when set."""
    assert not chunk_attention.tiles(64, 8, 80, 180, history=True)["CASCADE"]
    monkeypatch.setattr(chunk_attention, "CASCADE_FROM", 256)
    assert chunk_attention.tiles(64, 8, 80, 180, history=True)["CASCADE"]
    assert chunk_attention.tiles(32, 8, 80, 180, history=True)["CASCADE"]
    assert not chunk_attention.tiles(32, 8, 80, 180, history=True)["LAZY"]  # (its parts merge in natural units)
    assert not chunk_attention.tiles(16, 8, 80, 180, history=True).get("CASCADE")
    assert not chunk_attention.tiles(32, 8, 80, 180).get("CASCADE")                  # (no history)
    assert not chunk_attention.tiles(64, 8, 40, 180, history=True).get("CASCADE")    # (a first call's few frames)


@pytest.mark.skipif(not CUDA, reason="the real size in bfloat16: needs a GPU")
@pytest.mark.parametrize("cascade_from", [0, 256], ids=["per row", "once per voice"])
def test_a_steady_call_of_32_streams_in_a_cuda_graph(monkeypatch, cascade_from):
    """64 rows (32 streams' CFG pairs, 2 voices), 8 heads, 80 new frames after a 140-frame prefix and a ring of 40:
    tiles()'s choice (the prefix read by each row, or once per voice), captured and replayed, against the PyTorch
    form."""
    monkeypatch.setattr(chunk_attention, "CASCADE_FROM", cascade_from)
    gen = torch.Generator(DEVICE).manual_seed(9)
    q, k, v = qkv(gen, 64, 8, 80, 64, torch.bfloat16)
    lengths = torch.full((64,), 80, dtype=torch.int32, device=DEVICE)
    lengths[5] = 20
    pk, pv = (torch.randn(4, 8, 140, 64, generator=gen, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    voice = torch.randint(0, 2, (32,), generator=gen, device=DEVICE)
    prefix = (pk, pv, torch.cat([2 * voice, 2 * voice + 1]))
    hk, hv = (torch.randn(66, 8, 40, 64, generator=gen, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    history = (hk, hv, torch.arange(64, device=DEVICE), torch.full((64,), 40, device=DEVICE))
    assert chunk_attention.tiles(64, 8, 80, 180, history=True)["CASCADE"] == bool(cascade_from)
    kernel(q, k, v, lengths, 20, prefix, history=history)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel(q, k, v, lengths, 20, prefix, history=history)
    out.fill_(float("nan"))
    graph.replay()
    want = reference(q, k, v, lengths, 20, prefix, history).float()
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
