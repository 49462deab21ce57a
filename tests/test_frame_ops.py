"""The estimator's per-frame kernels (codec/frame_ops.py) against their PyTorch forms, each part on and off; and a
whole flow call with every kernel against the same call in PyTorch. Without CUDA the kernels run in Triton's CPU
interpreter (float32); with CUDA also in bfloat16 at the real width."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("triton", reason="triton is not importable; the codec's frame kernels untested")

from services.vocoder.codec import frame_ops  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPES = [torch.float32] + ([torch.bfloat16] if CUDA else [])


def tolerance(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=2e-2)


def layer_norm(C, seed, dtype):
    norm = nn.LayerNorm(C)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(C, generator=gen))
        norm.bias.copy_(0.3 * torch.randn(C, generator=gen))
    return norm.to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("parts", [
    dict(norm=True, mish=True, rows=1),                       # a resnet's first block: its time term, shared
    dict(norm=True, mish=True, rows=2, then=True),            # per-row terms (the reference's per-row t)
    dict(norm=True, mish=True, residual=True, then=True),     # a resnet's second block and the next norm1
    dict(residual=True, then=True),                           # an attention's residual and norm3
    dict(residual=True),                                      # the last feed-forward of a level
    dict(norm=True, mish=True),                               # the final block
])
@pytest.mark.parametrize("B,T,C", [(3, 37, 32), (2, 20, 48)])
def test_frame_norm_is_the_pytorch_form(B, T, C, parts, dtype):
    gen = torch.Generator(DEVICE).manual_seed(B * T + C)
    h = (3 * torch.randn(B, T, C, generator=gen, device=DEVICE)).to(dtype)
    h[0, 0, :4] = torch.tensor([-40.0, -19.0, 21.0, 60.0])   # Mish's tails
    kwargs = dict(mish=parts.get("mish", False))
    if parts.get("norm"):
        kwargs["norm"] = layer_norm(C, 1, dtype)
    if parts.get("then"):
        kwargs["then"] = layer_norm(C, 2, dtype)
    if "rows" in parts:
        kwargs["rows"] = torch.randn(1 if parts["rows"] == 1 else B, C, generator=gen, device=DEVICE).to(dtype)
    if parts.get("residual"):
        kwargs["residual"] = torch.randn(B, T, C, generator=gen, device=DEVICE).to(dtype)
    with torch.inference_mode():
        want, got = frame_ops.reference(h, **kwargs), frame_ops.kernel(h, **kwargs)
    pairs = zip(want, got) if "then" in kwargs else [(want, got)]
    for w, g in pairs:
        assert g.shape == (B, T, C) and g.dtype == dtype
        torch.testing.assert_close(g.float(), w.float(), **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("B,T,C,k", [(2, 37, 24, 3), (3, 5, 16, 3), (1, 18, 8, 2)])
def test_causal_unfold_is_the_pytorch_form(B, T, C, k, prefix, dtype):
    gen = torch.Generator(DEVICE).manual_seed(T)
    x = torch.randn(B, T + 4, C, generator=gen, device=DEVICE).to(dtype)[:, 2 : T + 2]   # a strided view
    left = None
    if prefix:
        left = (torch.randn(4, k - 1, C, generator=gen, device=DEVICE).to(dtype),
                torch.randint(0, 4, (B,), generator=gen, device=DEVICE))
    want, got = frame_ops.unfold_reference(x, k, left), frame_ops.unfold_kernel(x, k, left)
    assert got.shape == (B, T, C * k)
    torch.testing.assert_close(got, want, atol=0, rtol=0)           # a copy: exact
    conv = nn.Conv1d(C, 5, k).to(DEVICE, dtype)                       # with its weight in the order of the taps
    padded = (torch.nn.functional.pad(x, (0, 0, k - 1, 0)) if left is None
              else torch.cat([left[0].index_select(0, left[1]), x], 1))
    with torch.inference_mode():
        direct = torch.nn.functional.conv1d(padded.transpose(1, 2), conv.weight, conv.bias).transpose(1, 2)
        product = torch.nn.functional.linear(got, frame_ops.taps_weight(conv.weight), conv.bias)
    torch.testing.assert_close(product.float(), direct.float(), **tolerance(dtype))


def rings_to_keep(dtype, heads: int, B: int = 3, T: int = 29, d: int = 16, ring: int = 12):
    """An attention's keys and values [B, heads, T, d] (the estimator's strides) and five rows of rings [5, heads,
    ring, d] they go into: row b into ring rows[b] from place at[b], its first lengths[b] frames (T: more than the ring
    holds, 7: fewer, wrapping past its end, 0: none) → (k, v, ring keys, ring values, rows, at, lengths, generator)."""
    gen = torch.Generator(DEVICE).manual_seed(12)
    qkv = torch.randn(B, T, 3, heads, d, generator=gen, device=DEVICE).to(dtype)
    _, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    hk, hv = (torch.randn(5, heads, ring, d, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
    rows, at = torch.tensor([2, 0, 4], device=DEVICE), torch.tensor([3, 5, 0], device=DEVICE)
    lengths = torch.tensor([T, 7, 0], dtype=torch.int32, device=DEVICE)
    return k, v, hk, hv, rows, at, lengths, gen


@pytest.mark.parametrize("frames_per_program", [16, 4, 32])
@pytest.mark.parametrize("dtype", DTYPES)
def test_frame_norm_keeps_keys_and_values_in_their_rings(dtype, frames_per_program, monkeypatch):
    """An attention's keys and values into a stream history's ring (history.py), by the residual's kernel: each row's
    last `ring` frames (more than the ring holds, fewer, none), wrapping past its end; other rows untouched. With
    the default frames a program, and with fewer and more (bench/studies/codec_flow_profile.py times them)."""
    monkeypatch.setattr(frame_ops, "ROWS_PER_PROGRAM", frames_per_program)
    B, H, T, d, ring = 3, 2, 29, 16, 12
    k, v, hk, hv, rows, at, lengths, gen = rings_to_keep(dtype, H, B, T, d, ring)
    h = torch.randn(B, T, H * d, generator=gen, device=DEVICE).to(dtype)
    residual = torch.randn(B, T, H * d, generator=gen, device=DEVICE).to(dtype)
    mine, theirs = (hk.clone(), hv.clone()), (hk.clone(), hv.clone())
    got = frame_ops.kernel(h, residual=residual, keep=(k, v, *mine, rows, at, lengths))
    frame_ops.keep_reference(k, v, *theirs, rows, at, lengths)
    torch.testing.assert_close(got.float(), frame_ops.reference(h, residual=residual).float(), **tolerance(dtype))
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, atol=0, rtol=0)                    # a copy: exact
    places = (5 + torch.arange(7, device=DEVICE)) % ring                    # row 1: 7 frames from place 5, wrapping
    assert torch.equal(mine[0][0][:, places], k[1, :, :7])
    assert torch.equal(mine[0][2][:, (3 + torch.arange(T - ring, T, device=DEVICE)) % ring], k[0, :, T - ring :])
    assert torch.equal(mine[0][4], hk[4]) and torch.equal(mine[0][1], hk[1])  # no frames, no row: untouched


@pytest.mark.parametrize("frames_per_program", [16, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_unfold_keeps_each_rows_last_frames(dtype, frames_per_program, monkeypatch):
    """A stream history's convolution (history.py): each row reads its left frames from one row of the store and
    leaves the k-1 frames before its end in another, taking the left frames' last when it is shorter than them; with
    the default frames a program and fewer (a row then spans programs)."""
    monkeypatch.setattr(frame_ops, "ROWS_PER_PROGRAM", frames_per_program)
    gen = torch.Generator(DEVICE).manual_seed(11)
    C, k = 24, 3
    x = torch.randn(3, 10, C, generator=gen, device=DEVICE).to(dtype)
    store = torch.randn(8, k - 1, C, generator=gen, device=DEVICE).to(dtype)
    rows, keep = torch.tensor([0, 1, 2], device=DEVICE), torch.tensor([5, 6, 7], device=DEVICE)
    lengths = torch.tensor([10, 1, 0], device=DEVICE)
    mine, theirs = store.clone(), store.clone()
    want = frame_ops.unfold_reference(x, k, (theirs, rows, keep, lengths))
    got = frame_ops.unfold_kernel(x, k, (mine, rows, keep, lengths))
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(mine, theirs, atol=0, rtol=0)
    assert torch.equal(mine[5], x[0, 8:10])                                  # a long row: its last two frames
    assert torch.equal(mine[6], torch.stack([store[1, 1], x[1, 0]]))         # one frame: the left's last, then it
    assert torch.equal(mine[7], store[2])                                    # none: its left frames as they were
    assert torch.equal(mine[:5], store[:5])                                  # the rows read: untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_row", [False, True])
def test_euler_step_is_the_pytorch_form(dtype, per_row):
    """One step size for every row, or each row's own (rows at different steps of a solve: flow.py's solve_step)."""
    gen = torch.Generator(DEVICE).manual_seed(3)
    B, T, Cin, C = 3, 29, 40, 10
    inputs = torch.randn(2 * B, T, Cin, generator=gen, device=DEVICE).to(dtype)
    inputs[B:, :, :C] = inputs[:B, :, :C]
    v = torch.randn(2 * B, T, C, generator=gen, device=DEVICE).to(dtype)
    mask = (torch.arange(T, device=DEVICE)[None, :] < torch.tensor([T, 11, 0], device=DEVICE)[:, None]).to(dtype)[..., None]
    dt = torch.tensor([0.0123, 0.2, 0.05], device=DEVICE) if per_row else 0.0123
    want, got = inputs.clone(), inputs.clone()
    frame_ops.euler_reference(want, v, mask, dt, 0.7)
    frame_ops.euler_kernel(got, v, mask, dt, 0.7)
    if per_row:                                       # each row by its own step: as if stepped alone
        alone = inputs[[1, 4]].clone()
        frame_ops.euler_reference(alone, v[[1, 4]], mask[1:2], 0.2, 0.7)
        torch.testing.assert_close(got[[1, 4]].float(), alone.float(), **tolerance(dtype))
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))
    torch.testing.assert_close(got[B:, :, :C], got[:B, :, :C], atol=0, rtol=0)   # both halves
    torch.testing.assert_close(got[:, :, C:], inputs[:, :, C:], atol=0, rtol=0)  # the conditions untouched
    assert torch.equal(got[1, 11:, :C], inputs[1, 11:, :C])                     # no step past a row's frames
    assert not torch.equal(got[0, :, :C], inputs[0, :, :C])


def test_a_flow_call_with_the_kernels_is_the_pytorch_flow(monkeypatch):
    """The tiny flow in streaming mode with its prompt prefix, a batch of rows of different lengths, in float32:
    every frame_ops kernel (on a CPU: in the interpreter) against the PyTorch forms on the same device."""
    from services.vocoder.codec.checkpoint import random_codec
    from services.vocoder.codec.config import tiny
    from services.vocoder.codec.decoder import FlowTokenDecoder
    from services.vocoder.codec.flow_state import FlowState
    from services.vocoder.codec.voice import random_voice

    cfg = tiny()
    flow = random_codec(cfg, 0)[0]
    voice = random_voice(cfg.flow, "alto", prompt_tokens=10, seed=1)
    decoder = FlowTokenDecoder(flow, DEVICE, dtype=torch.float32, graphs=False, prefix_min_rows=1,
                               n_timesteps=1)  # 1 step (every kernel runs in it): the interpreter's time
    decoder.set_voices([voice])
    gen = torch.Generator().manual_seed(4)
    streams = [FlowState(voice, tuple(torch.randint(0, 1024, (n,), generator=gen).tolist()), 0, d)
               for n, d in ((8, 0), (23, 10))]
    results = {}
    for kernels in (False, True):
        monkeypatch.setattr(frame_ops, "on_gpu", lambda x, kernels=kernels: kernels)
        results[kernels] = decoder.decode_chunks([([], s) for s in streams])
    for (w, _), (g, _) in zip(results[False], results[True]):
        assert g.shape == w.shape and w.shape[1] > 0
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)
