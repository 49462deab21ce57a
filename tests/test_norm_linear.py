"""A transformer block's norms and residuals inside its products (codec/norm_linear.py) against PyTorch's op-by-op
forms: each kernel, a block, and flow calls with a stream history (keys and values kept by the output product's
kernel). Without CUDA the kernels run in Triton's CPU interpreter (float32); with CUDA also in bfloat16 at the real
width."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not importable; the codec's folded norms untested")

from test_frame_ops import CUDA, DEVICE, DTYPES, layer_norm, tolerance  # noqa: E402

from services.vocoder.codec import frame_ops, norm_linear  # noqa: E402

# (frames B x T, product K → N): odd sizes (masks); with CUDA q|k|v and the feed-forward at a 6-stream call
SHAPES = [(2, 19, 40, 24), (3, 7, 70, 150)] + ([(12, 80, 256, 1536), (12, 80, 256, 1024)] if CUDA else [])


def frames(B, T, K, dtype, seed, offset=0.0):
    gen = torch.Generator(DEVICE).manual_seed(seed)
    return (offset + 2 * torch.randn(B, T, K, generator=gen, device=DEVICE)).to(dtype)


def linear(K, N, dtype, seed):
    gen = torch.Generator(DEVICE).manual_seed(seed)
    weight = (torch.randn(N, K, generator=gen, device=DEVICE) / K ** 0.5).to(dtype)
    return weight, torch.randn(N, generator=gen, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("offset", [0.0, 30.0])   # a residual stream's frames need not be centred
@pytest.mark.parametrize("B,T,K,N", SHAPES)
def test_norm_linear_is_the_norm_then_the_product(B, T, K, N, offset, gelu, dtype):
    x, norm = frames(B, T, K, dtype, seed=K, offset=offset), layer_norm(K, 3, dtype)
    weight, bias = linear(K, N, dtype, seed=N)
    with torch.inference_mode():
        got = norm_linear.norm_linear(x, norm_linear.fold(norm, weight, bias), gelu=gelu)
        want = norm_linear.reference_norm_linear(x, norm, weight, bias, gelu)   # PyTorch, rounding after each op
        exact = norm_linear.reference_norm_linear(x.float(), norm.float(), weight.float(), bias.float(), gelu)
    assert got.shape == (B, T, N) and got.dtype == dtype
    # Frames 15 spreads off zero: the product on raw frames less mean x c cancels ~15x, in float32 still ~1e-5
    # relative to the outputs (bf16 rounds at 4e-3)
    close = dict(atol=2e-4, rtol=1e-4) if dtype == torch.float32 and offset else tolerance(dtype)
    torch.testing.assert_close(got.float(), want.float(), **close)
    if dtype != torch.float32:  # no further from float32's than PyTorch's rounding after each op, give or take
        assert (got.float() - exact).abs().mean() <= 1.5 * (want.float() - exact).abs().mean()


def test_norm_linear_without_a_bias_and_a_mutation_of_its_statistics_fails():
    """No bias (q|k|v); and the fold is what makes it right: the product against the unfolded weight is not."""
    x, norm = frames(2, 9, 32, torch.float32, seed=1, offset=5.0), layer_norm(32, 4, torch.float32)
    weight, _ = linear(32, 48, torch.float32, seed=2)
    with torch.inference_mode():
        folded = norm_linear.fold(norm, weight)
        got = norm_linear.norm_linear(x, folded)
        want = F.linear(norm(x), weight)
        unfolded = norm_linear.norm_linear(x, norm_linear.FoldedNorm(weight, folded.colsum, folded.shift, folded.eps))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (unfolded - want).abs().max() > 1e-2


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_residual_adds_bias_and_residual_and_keeps_keys_and_values(dtype):
    """out = x @ W.T + b + residual and out + shift; the keys and values into their rings as frame_ops' keep does
    (rows with more frames than the ring, fewer, none; other rows untouched)."""
    gen = torch.Generator(DEVICE).manual_seed(12)
    B, H, T, d, ring, C = 3, 2, 29, 16, 12, 24
    qkv = torch.randn(B, T, 3, H, d, generator=gen, device=DEVICE).to(dtype)
    _, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)                          # the estimator's strides
    hk, hv = (torch.randn(5, H, ring, d, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
    rows, at = torch.tensor([2, 0, 4], device=DEVICE), torch.tensor([3, 5, 0], device=DEVICE)
    lengths = torch.tensor([T, 7, 0], dtype=torch.int32, device=DEVICE)
    x = torch.randn(B, T, H * d, generator=gen, device=DEVICE).to(dtype)
    residual = torch.randn(B, T, C, generator=gen, device=DEVICE).to(dtype)
    weight, bias = linear(H * d, C, dtype, seed=5)
    shift = torch.randn(C, generator=gen, device=DEVICE).to(dtype)
    mine, theirs = (hk.clone(), hv.clone()), (hk.clone(), hv.clone())
    with torch.inference_mode():
        out, second = norm_linear.linear_residual(x, weight, bias, residual, shift, (k, v, *mine, rows, at, lengths))
        want = F.linear(x, weight, bias) + residual
    frame_ops.keep_reference(k, v, *theirs, rows, at, lengths)
    torch.testing.assert_close(out.float(), want.float(), **tolerance(dtype))
    torch.testing.assert_close(second.float(), (out + shift).float(), **tolerance(dtype))
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, atol=0, rtol=0)                    # a copy: exact
    assert not torch.equal(mine[0], hk)                                     # (it kept something)


def test_a_block_folded_is_the_block():
    """A transformer block in five kernels against its forward (float32, CPU: the interpreter)."""
    from services.vocoder.codec.estimator import BasicTransformerBlock

    torch.manual_seed(0)
    block = BasicTransformerBlock(32, 2, 16).to(DEVICE).eval()
    with torch.no_grad():
        for norm in (block.norm1, block.norm3):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0, 0.3)
    x = frames(2, 23, 32, torch.float32, seed=8, offset=3.0)
    lengths = torch.tensor([23, 15], dtype=torch.int32, device=DEVICE)
    with torch.inference_mode():
        block.fold_norms()
        got = block.folded_forward(x, lengths, chunk=8)
        want = block(x, block.norm1(x), lengths, chunk=8)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_flow_calls_with_a_history_folded_are_the_calls_unfolded(monkeypatch):
    """The tiny flow with a stream history, every kernel on (the interpreter on a CPU): two calls of two streams,
    the second reading what the first kept; the blocks folded against frame_ops' per-frame kernels. Also: the folded
    weights follow a new state dict."""
    from services.vocoder.codec.checkpoint import random_codec
    from services.vocoder.codec.config import tiny
    from services.vocoder.codec.decoder import FlowTokenDecoder
    from services.vocoder.codec.voice import random_voice

    cfg = tiny()
    monkeypatch.setattr(frame_ops, "on_gpu", lambda x: True)
    voice = random_voice(cfg.flow, "alto", prompt_tokens=10, seed=1)
    gen = torch.Generator().manual_seed(4)
    tokens = [torch.randint(0, 1024, (30,), generator=gen).tolist() for _ in range(2)]
    mels = {}
    for folded in (False, True):
        monkeypatch.setattr(norm_linear, "FOLDED", folded)
        decoder = FlowTokenDecoder(random_codec(cfg, 0)[0], DEVICE, dtype=torch.float32, graphs=False, n_timesteps=1,
                                   history_streams=2)
        decoder.set_voices([voice])
        assert decoder.history is not None
        states, out = [decoder.start(voice) for _ in tokens], []
        for a, b in ((0, 13), (13, 23)):
            result = decoder.decode_chunks([(t[a:b], s) for t, s in zip(tokens, states)])
            states = [s for _, s in result]
            out.append(torch.cat([m for m, _ in result], 1))
        mels[folded] = out
        estimator = decoder.flow.decoder.estimator
    for w, g in zip(mels[False], mels[True]):
        assert g.shape == w.shape and w.shape[1] > 0
        torch.testing.assert_close(g, w, atol=5e-5, rtol=1e-5)
    assert estimator.folded_as is not None
    estimator.load_state_dict({k: v * 1.01 for k, v in estimator.state_dict().items()})
    assert estimator.folded_as is None   # folded again at its next call
