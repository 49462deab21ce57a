"""The estimator's products at few frames with their weights read before the launch wait (codec/prefetch_linear.py)
against PyTorch's product (and exact GELU). Without CUDA the kernel runs in Triton's CPU interpreter (float32) and is
compiled for sm_90 to check what a GPU would run; with CUDA also in bfloat16 at the estimator's widths, and a whole
flow call through it against the call through cuBLAS's products."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not importable; the codec's products untested")

from conftest import interpreter_only  # noqa: E402
from test_frame_ops import DEVICE, DTYPES, layer_norm, rings_to_keep, tolerance  # noqa: E402
from test_fused_linear import product  # noqa: E402  (x [B, T, K], weight [N, K], bias [N], seeded)

from services.vocoder.codec import frame_ops, prefetch_linear  # noqa: E402

CUDA = torch.cuda.is_available()
# (frames B x T, product K → N): odd sizes (masks), K over one chunk (2 and 3 of them), both tiles; with CUDA the estimator's
# products (q|k|v, output, feed-forward, a convolution's unfolded frames) at 80 and 320 frames
SHAPES = [(2, 19, 40, 24), (1, 37, 300, 70), (3, 7, 600, 33), (1, 170, 40, 72)] + (
    [(1, 80, 256, 768), (1, 80, 256, 256), (4, 80, 256, 1024), (4, 80, 1024, 256), (1, 80, 960, 256)] if CUDA else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gelu", [False, True], ids=["plain", "gelu"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("B,T,K,N", SHAPES)
def test_the_kernel_is_the_product(B, T, K, N, with_bias, gelu, dtype):
    x, weight, bias = product(B, T, K, N, dtype, seed=K + N)
    bias = bias if with_bias else None
    with torch.inference_mode():
        got = prefetch_linear.kernel(x, weight, bias, gelu)
        want = F.linear(x, weight, bias)
        exact = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        if gelu:
            want, exact = F.gelu(want), F.gelu(exact)
    assert got.shape == (B, T, N) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))
    if gelu and dtype != torch.float32:  # rounded once, where PyTorch rounds the product and then its GELU: no
        # further from float32's answer than PyTorch's (a plain product both round once: equally close, either ahead)
        assert (got.float() - exact).abs().mean() <= 1.05 * (want.float() - exact).abs().mean()


def test_a_program_s_weight_slice_fits_shared_memory():
    """The channels of a tile halve until K x channels fits SLICE_BYTES (an SM's shared memory holds the slice);
    bf16's tiles as measured, float32's at K 1,024 halved."""
    assert prefetch_linear.tiles(80, 1024, 2) == (16, 16, 2) and prefetch_linear.tiles(320, 1024, 2) == (32, 64, 4)
    for M in (80, 320, 5120):
        for K in (40, 256, 768, 1024):
            for itemsize in (2, 4):
                _, block_n, _ = prefetch_linear.tiles(M, K, itemsize)
                assert K * block_n * itemsize <= prefetch_linear.SLICE_BYTES
    assert prefetch_linear.tiles(320, 1024, 4)[1] == 32


FOLD_SHAPES = [(2, 19, 40, 24), (1, 37, 200, 70)] + ([(1, 80, 256, 768), (1, 80, 256, 1024)] if CUDA else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gelu", [False, True], ids=["plain", "gelu"])
@pytest.mark.parametrize("B,T,K,N", FOLD_SHAPES)
def test_the_kernel_folds_a_norm_and_a_residual(B, T, K, N, gelu, dtype):
    """[gelu](norm(x) @ W.T + b) + residual: the norm made as the frames load (rounded as frame_norm stores it), the
    residual added before the one rounding."""
    x, weight, bias = product(B, T, K, N, dtype, seed=K + N)
    norm = layer_norm(K, seed=N, dtype=dtype)
    residual = product(B, T, N, 1, dtype, seed=N)[0]
    with torch.inference_mode():
        got = prefetch_linear.kernel(x, weight, bias, gelu, norm, residual)
        want = (F.gelu if gelu else lambda t: t)(F.linear(norm(x), weight, bias)) + residual
        plain = prefetch_linear.kernel(x, weight, bias, gelu, norm)
    assert got.shape == (B, T, N) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))
    torch.testing.assert_close(plain.float(), (want - residual).float(), **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [40, 200], ids=["fewer-programs-than-heads", "more"])
def test_the_kernel_keeps_keys_and_values_as_frame_norm_does(N, dtype):
    """The output product's keep: each row's last `ring` frames into its ring (more than it holds, fewer, none),
    wrapping, other rows untouched; the heads shared out among a frame tile's programs (16 channels a program: 3 of
    them for 5 heads, or 13), every head copied once. Exactly frame_ops.keep_reference's copy."""
    B, H, T, d = 3, 5, 29, 16
    k, v, hk, hv, rows, at, lengths, _ = rings_to_keep(dtype, H, B, T, d)
    x, weight, bias = product(B, T, H * d, N, dtype, seed=4)
    residual = product(B, T, N, 1, dtype, seed=5)[0]
    mine, theirs = (hk.clone(), hv.clone()), (hk.clone(), hv.clone())
    with torch.inference_mode():
        got = prefetch_linear.kernel(x, weight, bias, residual=residual, keep=(k, v, *mine, rows, at, lengths))
    frame_ops.keep_reference(k, v, *theirs, rows, at, lengths)
    torch.testing.assert_close(got.float(), (F.linear(x, weight, bias) + residual).float(), **tolerance(dtype))
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, atol=0, rtol=0)                    # a copy: exact
    assert not torch.equal(mine[0][2], hk[2]) and torch.equal(mine[0][1], hk[1])  # a row's frames in; no row: untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("left", ["zeros", "prefix", "history"])
@pytest.mark.parametrize("C,N", [(24, 40), (100, 16)] + ([(256, 256)] if CUDA else []))
def test_the_kernel_is_a_causal_convolution_reading_its_taps_itself(C, N, left, dtype):
    """causal_conv through the kernel against causal_unfold's frames times the taps: zeros before a row's first
    frame, a prompt prefix's last frames, or a stream history's (each row reads its left frames from one row of the
    store and leaves the k-1 frames before its end in another: a long row, a row of one frame, a row of none)."""
    gen = torch.Generator(DEVICE).manual_seed(C + N)
    k, B, T = 3, 3, 19
    x = torch.randn(B, T, C, generator=gen, device=DEVICE).to(dtype)
    weight = (torch.randn(N, C, k, generator=gen, device=DEVICE) / (k * C) ** 0.5).to(dtype)
    taps, bias = frame_ops.taps_weight(weight), torch.randn(N, generator=gen, device=DEVICE).to(dtype)
    store = torch.randn(8, k - 1, C, generator=gen, device=DEVICE).to(dtype)
    rows, keep = torch.tensor([0, 1, 2], device=DEVICE), torch.tensor([5, 6, 7], device=DEVICE)
    lengths = torch.tensor([T, 1, 0], device=DEVICE)
    mine, theirs = store.clone(), store.clone()
    lefts = {"zeros": (None, None), "prefix": ((mine, rows), (theirs, rows)),
             "history": ((mine, rows, keep, lengths), (theirs, rows, keep, lengths))}[left]
    with torch.inference_mode():
        got = prefetch_linear.kernel(x, taps, bias, conv=(k, lefts[0]))
        want = F.linear(frame_ops.unfold_reference(x, k, lefts[1]), taps, bias)
    assert got.shape == (B, T, N)
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))
    torch.testing.assert_close(mine, theirs, atol=0, rtol=0)               # the kept frames: copies, exact
    if left == "history":
        assert torch.equal(mine[5], x[0, T - 2 :]) and torch.equal(mine[6], torch.stack([store[1, 1], x[1, 0]]))
    assert torch.equal(mine[:5], store[:5])                                  # the rows read: untouched


def test_causal_conv_folds_only_where_the_kernel_runs(monkeypatch):
    """On a CPU (or with FOLD off, or frames wider than a chunk) causal_unfold, then the product; else one kernel."""
    x = torch.randn(2, 5, 16)
    weight = torch.randn(8, 16, 3)
    taps = frame_ops.taps_weight(weight)
    want = F.linear(frame_ops.unfold_reference(x, 3), taps)
    torch.testing.assert_close(prefetch_linear.causal_conv(x, taps, None, 3), want)
    calls = []
    monkeypatch.setattr(prefetch_linear, "on_gpu", lambda t: True)
    monkeypatch.setattr(prefetch_linear, "kernel", lambda *a, **kw: calls.append("conv" in kw) or want)
    prefetch_linear.causal_conv(x, taps, None, 3)
    monkeypatch.setattr(prefetch_linear, "FOLD", False)
    prefetch_linear.causal_conv(x, taps, None, 3)                           # the product alone through the kernel
    assert calls == [True, False]


def test_a_norm_over_more_than_one_chunk_is_refused():
    x, weight, _ = product(1, 4, prefetch_linear.K_CHUNK + 8, 8, torch.float32, seed=1)
    with pytest.raises(ValueError, match="whole frames"):
        prefetch_linear.kernel(x, weight, norm=layer_norm(x.shape[-1], 1, torch.float32))


@interpreter_only  # (on a GPU: the flow call below and test_codec_history's)
def test_streamed_calls_folded_into_the_kernel_are_the_calls_apart(monkeypatch):
    """A stream's calls (a stream history: its kept keys and convolutions' left frames) at the tiny codec's size, the
    transformer blocks, the convolutions' taps and the resnets' res_conv (in their first convolution's product) folded
    into the kernel (Triton's interpreter, float32) against the same calls apart (PyTorch): the same mel."""
    from test_codec_stream import SCHEDULES, codes, stream_mel

    from services.vocoder.loader import FlowOptions, load_vocoder

    # 2 Euler steps, 3 calls and the last (the interpreter runs each program of ~100 kernels a step in turn)
    v = load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=2, n_timesteps=2))
    tokens, schedule = codes(23), SCHEDULES["gateway"]
    apart = stream_mel(v, tokens, schedule)
    folded = []
    real = prefetch_linear.kernel
    monkeypatch.setattr(prefetch_linear, "on_gpu", lambda x: True)
    # each call: what it folds in (kept keys; a convolution's taps, with a history's left frames kept)
    merged = {r.taps_and_res.data_ptr() for r in v.decoder.flow.decoder.estimator.modules() if hasattr(r, "taps_and_res")}
    monkeypatch.setattr(prefetch_linear, "kernel", lambda *a, **kw: folded.append(
        "keep" if len(a) > 6 and a[6] is not None else "conv" if kw.get("conv") and len(kw["conv"][1] or ()) == 4
        else "resnet" if a[1].data_ptr() in merged else "") or real(*a, **kw))
    monkeypatch.setattr(prefetch_linear, "TILE", (128, 64, 4))  # few programs: the interpreter runs each in turn
    got = stream_mel(v, tokens, schedule)
    assert {"keep", "conv", "resnet"} <= set(folded)
    torch.testing.assert_close(got, apart, atol=1e-4, rtol=1e-4)
    assert apart.abs().max() > 0.5


def test_frames_read_through_a_view():
    """q|k|v's frames and a causal convolution's unfolded ones may be views whose rows are wider than K."""
    wide, weight, bias = product(2, 9, 96, 40, torch.float32, seed=3)
    x = wide[..., 16:64]                                    # rows of 96, K = 48
    with torch.inference_mode():
        got = prefetch_linear.kernel(x, weight[:, :48].contiguous(), bias)
    torch.testing.assert_close(got, F.linear(x, weight[:, :48], bias), **tolerance(torch.float32))


def test_a_weight_past_four_chunks_is_refused():
    x, weight, _ = product(1, 4, prefetch_linear.MAX_K + 8, 8, torch.float32, seed=1)
    with pytest.raises(ValueError, match="at most"):
        prefetch_linear.kernel(x, weight)


def test_linear_runs_the_kernel_only_where_it_is_meant_to(monkeypatch):
    """ENABLED, on a GPU, at most MAX_ROWS frames and MAX_K inputs; else PyTorch's product (and fused_linear's
    GELU), which on a CPU is PyTorch's too."""
    x, weight, bias = product(2, 5, 16, 8, torch.float32, seed=1)
    want = F.linear(x, weight, bias)
    torch.testing.assert_close(prefetch_linear.linear(x, weight, bias), want)
    torch.testing.assert_close(prefetch_linear.linear(x, weight, bias, gelu=True), F.gelu(want))
    calls = []
    monkeypatch.setattr(prefetch_linear, "kernel", lambda *a: calls.append(a[3]) or want)
    monkeypatch.setattr(prefetch_linear, "on_gpu", lambda t: True)
    monkeypatch.setattr(prefetch_linear, "ENABLED", True)
    prefetch_linear.linear(x, weight, bias, gelu=True)
    assert calls == [True]
    monkeypatch.setattr(prefetch_linear, "MAX_ROWS", 9)                  # 10 frames: cuBLAS's
    monkeypatch.setattr(prefetch_linear.F, "linear", lambda *a: calls.append("cublas") or want)
    prefetch_linear.linear(x, weight, bias)
    monkeypatch.setattr(prefetch_linear, "MAX_ROWS", 10)
    monkeypatch.setattr(prefetch_linear, "MAX_K", 15)                    # K = 16: cuBLAS's
    prefetch_linear.linear(x, weight, bias)
    monkeypatch.setattr(prefetch_linear, "MAX_K", 16)
    monkeypatch.setattr(prefetch_linear, "ENABLED", False)
    prefetch_linear.linear(x, weight, bias)
    assert calls == [True, "cublas", "cublas", "cublas"]


def test_the_weights_load_before_the_wait_in_what_a_gpu_runs():
    """Compiled for sm_90 here (no GPU needed): every load of the weight slice (and a folded norm's gamma and beta)
    comes before `griddepcontrol.wait`, every load of the frames after it, and nothing is stored before it (the kept
    keys and a history's left frames are stored after it: the kernels before read them)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # (compiled, not interpreted)
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "tests"), str(root / "protos"), env.get("PYTHONPATH", "")])
    script = ("import kernel_compile_check as k\n"
              "for n in k.KERNELS:\n"
              "    if 'before the wait' in n:\n"
              "        print('KERNEL', n); print(k.compiled(n, aligned=True).asm['ptx'])\n")
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600, check=True).stdout
    kernels = done.split("KERNEL ")[1:]
    assert len(kernels) == 4
    for text in kernels:
        name, ptx = text.split("\n", 1)
        folded = "norm folded in" in name
        # (chunks of K, BLOCK_N, threads): kernel_compile_check's entries
        chunks, block_n, threads = ((4, 16, 128) if "1024" in name else (1, 16, 64) if folded else
                                    (3, 16, 64) if "taps" in name else (1, 32, 128))
        lines = [line.strip() for line in ptx.splitlines()]
        wait = [i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait")]
        loads = [i for i, line in enumerate(lines) if "ld.global" in line]
        assert len(wait) == 1, name
        before = [i for i in loads if i < wait[0]]
        # the weight slice [256 x BLOCK_N] a chunk, bf16: at least 256·BLOCK_N·2 / (threads·16) vector loads a thread,
        # and with a norm its gamma and beta (256 each) too
        weight = chunks * 256 * block_n * 2 // (threads * 16)
        assert len(before) >= weight + 2 * folded, (name, len(before))
        assert any(i > wait[0] for i in loads), name                          # the frames, after it
        assert not any("st.global" in line for line in lines[: wait[0]]), name
        assert any("mma" in line for line in lines[wait[0]:]), name


@pytest.mark.skipif(not CUDA, reason="needs CUDA: a whole flow call in bf16 through the kernel")
def test_a_flow_call_through_the_kernel_matches_cublas(monkeypatch):
    """A first call and a steady call at the real size, through cuBLAS's products and through the kernel: mel SNR
    at least 40 dB (both bf16)."""
    from services.vocoder.codec.checkpoint import random_codec
    from services.vocoder.codec.config import moss_speech
    from services.vocoder.codec.decoder import FlowTokenDecoder
    from services.vocoder.codec.voice import random_voice

    cfg = moss_speech()
    voice = random_voice(cfg.flow, prompt_tokens=40, seed=3)
    tokens = torch.randint(0, 16384, (2, 28), generator=torch.Generator().manual_seed(1)).tolist()
    mels = {}
    for enabled in (False, True):
        monkeypatch.setattr(prefetch_linear, "ENABLED", enabled)
        d = FlowTokenDecoder(random_codec(cfg, 0)[0], torch.device("cuda"), history_streams=2)
        d.set_voices([voice])
        states = [d.start(voice) for _ in range(2)]
        first = d.decode_chunks([(tokens[i][:8], s) for i, s in enumerate(states)])
        steady = d.decode_chunks([(tokens[i][8:28], s) for i, (_, s) in enumerate(first)])
        mels[enabled] = torch.cat([m.float() for m, _ in first + steady], 1)
        for _, s in steady:
            d.history.release(s.stream)
    noise = (mels[True] - mels[False]).pow(2).mean()
    assert 10 * torch.log10(mels[False].pow(2).mean() / noise) >= 40
