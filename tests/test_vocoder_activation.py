"""The fused anti-aliased Snake/SnakeBeta kernel (services/vocoder/activation.py) against bigvgan's eager
Activation1d, alone and inside whole generators.

Without CUDA the kernel runs in Triton's CPU interpreter in float32 (edge cases of T, tile edges, both activations,
log scale on and off, random asymmetric filters so that a flipped tap order cannot hide); with CUDA it also runs
natively at the 480x preset's shapes in fp32 and bf16, and inside a captured CUDA graph.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first @triton.jit

try:
    import triton  # noqa: F401
except ImportError as e:  # pragma: no cover
    pytest.skip(f"triton is not importable ({e})", allow_module_level=True)

import bigvgan  # noqa: E402
from bigvgan.activations import Snake, SnakeBeta  # noqa: E402
from bigvgan.alias_free_activation.torch.act import Activation1d  # noqa: E402
from bigvgan.env import AttrDict  # noqa: E402

from services.vocoder.activation import FusedActivation1d, anti_aliased_snake, fuse_activations  # noqa: E402
from services.vocoder.channels_last import to_channels_last  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = dict(rtol=1e-5, atol=1e-5)
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

# The project's tiny preset (services/vocoder/configs/tiny.json), spelled out so this test does not depend on
# the loader; the 480x preset is read from its file to count its activations.
TINY = {
    "resblock": "1", "num_mels": 80, "upsample_rates": [8, 6, 10], "upsample_kernel_sizes": [16, 12, 20],
    "upsample_initial_channel": 32, "resblock_kernel_sizes": [3], "resblock_dilation_sizes": [[1, 3]],
    "activation": "snakebeta", "snake_logscale": True, "use_tanh_at_final": False, "use_bias_at_final": False,
    "sampling_rate": 24000, "hop_size": 480,
}
PRESET_480X = Path(__file__).resolve().parents[1] / "services/vocoder/configs/bigvgan_24khz_80band_480x.json"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _randomize_snake(act: torch.nn.Module) -> None:
    """Non-default per-channel parameters: log-scale ones around 0 (alpha, beta in ~[0.4, 2.7]), linear ones
    in [0.2, 2.2] (never near 0, where 1/(beta + 1e-9) explodes in both implementations alike)."""
    with torch.no_grad():
        for p in act.parameters():
            p.copy_(torch.randn_like(p) * 0.5 if act.alpha_logscale else torch.rand_like(p) * 2 + 0.2)


def _activation(kind: str, channels: int, logscale: bool) -> Activation1d:
    """An eager Activation1d with random activation parameters and random asymmetric filters (loaded as a
    checkpoint would load them), so both the buffer loading and the tap order are exercised."""
    m = Activation1d((Snake if kind == "snake" else SnakeBeta)(channels, alpha_logscale=logscale))
    _randomize_snake(m.act)
    with torch.no_grad():
        state = m.state_dict()
        state["upsample.filter"] = state["upsample.filter"] + 0.05 * torch.randn(1, 1, 12)
        state["downsample.lowpass.filter"] = state["downsample.lowpass.filter"] + 0.05 * torch.randn(1, 1, 12)
        m.load_state_dict(state)
    return m.to(DEVICE)


def _check(kind: str, logscale: bool, b: int, c: int, t: int, scale: float = 2.0) -> float:
    m = _activation(kind, c, logscale)
    x = torch.randn(b, c, t, device=DEVICE) * scale
    with torch.no_grad():
        want = m(x)
        got = FusedActivation1d.of(m)(x)
    torch.testing.assert_close(got, want, **TOL)
    return (got - want).abs().max().item()


ACTS = [("snakebeta", True), ("snakebeta", False), ("snake", True), ("snake", False)]


@pytest.mark.parametrize("kind,logscale", ACTS, ids=[f"{k}-{'log' if s else 'lin'}" for k, s in ACTS])
@pytest.mark.parametrize("t", [1, 2, 3, 5, 11])
def test_short_signals_match_eager(kind, logscale, t):
    """T below the filters' reach (±5 samples): every output mixes both replicate pads (x's at 1×, Y's at 2×)."""
    _check(kind, logscale, 2, 3, t)


@pytest.mark.parametrize("b,c,t", [(1, 1, 15), (1, 1, 16), (2, 3, 17), (1, 3, 255), (1, 2, 256), (2, 3, 257),
                                   (1, 3, 300), (1, 13, 31), (2, 20, 9)])
@pytest.mark.parametrize("kind,logscale", [("snakebeta", True), ("snake", False)], ids=["snakebeta-log", "snake-lin"])
def test_tile_edges_and_channel_blocks_match_eager(kind, logscale, b, c, t):
    """Lengths at time-tile edges (tiles of 16 … 256), channel counts that are not a multiple of the channel
    block (16 channels at T ≤ 16, 8 at T ≤ 32), several batch rows."""
    _check(kind, logscale, b, c, t)


def test_large_arguments_and_bfloat16_params_model_cast():
    """Large |alpha·y| (sin's range reduction) and a model cast to bf16 afterwards: the fused module keeps its
    filters and alpha / 1/beta in fp32 (only the device follows)."""
    _check("snakebeta", True, 1, 4, 64, scale=30.0)
    fused = FusedActivation1d.of(_activation("snakebeta", 4, True)).to(torch.bfloat16)
    assert {buf.dtype for buf in fused.buffers()} == {torch.float32}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_io_computes_in_fp32(dtype):
    """bf16/fp16 in and out, fp32 inside: against the eager fp32 module on the same rounded input, only the
    output's rounding differs: half an ulp (2^-8 relative for bf16, 2^-11 for fp16) on a GPU; Triton 3.6's CPU
    interpreter truncates fp32 → bf16 on store instead of rounding, so up to a whole ulp there."""
    m = _activation("snakebeta", 20, True)
    x = (torch.randn(2, 20, 40, device=DEVICE) * 2).to(dtype)
    with torch.no_grad():
        got = FusedActivation1d.of(m)(x)
        want = m(x.float())
    assert got.dtype == dtype
    ulps = 1.0 if CUDA else 2.0
    rtol = ulps * (2**-8 if dtype == torch.bfloat16 else 2**-11) + TOL["rtol"]
    torch.testing.assert_close(got.float(), want, rtol=rtol, atol=TOL["atol"])


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """[B, C, T] → the same values as [B, C, 1, T] with the channels contiguous (the GPU runner's layout)."""
    return x.unsqueeze(2).contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("b,c,t", [(1, 3, 1), (2, 5, 11), (1, 70, 9), (2, 130, 37)])
def test_channels_last_layout_matches_eager(b, c, t):
    """Channels contiguous (64-channel blocks, a partial last block, short T): same values, same layout out."""
    m = _activation("snakebeta", c, True)
    x = torch.randn(b, c, t, device=DEVICE) * 2
    with torch.no_grad():
        got = FusedActivation1d.of(m)(_channels_last(x))
        want = m(x)
    assert got.shape == (b, c, 1, t) and got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got[:, :, 0], want, **TOL)


def test_torch_fallback_matches_eager():
    """The torch-ops path FusedActivation1d takes for CPU tensors when Triton's interpreter is off."""
    for kind, logscale in ACTS:
        m = _activation(kind, 5, logscale).cpu()
        x = torch.randn(2, 5, 37) * 2
        with torch.no_grad():
            torch.testing.assert_close(FusedActivation1d.of(m)._torch(x), m(x), **TOL)


def test_refuses_what_the_kernel_does_not_compute():
    with pytest.raises(ValueError, match="ratio 2 with 12-tap"):
        FusedActivation1d.of(Activation1d(SnakeBeta(3), up_ratio=3, down_ratio=3, up_kernel_size=18,
                                          down_kernel_size=18))
    with pytest.raises(ValueError, match="ratio 2 with 12-tap"):
        FusedActivation1d.of(Activation1d(SnakeBeta(3), up_kernel_size=10, down_kernel_size=10))
    with pytest.raises(ValueError, match="only Snake and SnakeBeta"):
        FusedActivation1d.of(Activation1d(torch.nn.ReLU()))

    model = torch.nn.Sequential(Activation1d(SnakeBeta(3)), Activation1d(SnakeBeta(3), up_kernel_size=10,
                                                                         down_kernel_size=10))
    with pytest.raises(ValueError, match="^1: "):
        fuse_activations(model)
    assert all(type(m) is Activation1d for m in model)  # nothing replaced
    assert fuse_activations(model, strict=False) == 1
    assert isinstance(model[0], FusedActivation1d) and isinstance(model[1], Activation1d)


# ---------------------------------------------------------------------------------------------------------------
# Whole generators


def _generator(config: dict, **overrides) -> bigvgan.BigVGAN:
    """bigvgan.BigVGAN from a config dict, weight norm folded, with random non-default snake parameters and
    convolutions rescaled to ~unit gain (the package's init, N(0, 0.01), would shrink the signal until every
    activation is nearly linear and the test would prove little)."""
    h = AttrDict(dict(config, **overrides))
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = bigvgan.BigVGAN(h, use_cuda_kernel=False)
        model.remove_weight_norm()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (Snake, SnakeBeta)):
                _randomize_snake(m)
            elif isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
                fan_in = m.weight.shape[1 if isinstance(m, torch.nn.Conv1d) else 0] * m.weight.shape[2]
                m.weight.normal_(0, 1 / fan_in**0.5)
    return model.eval()


def _activation_count(h: dict) -> int:
    per_block = 2 if h["resblock"] == "1" else 1
    per_stage = sum(per_block * len(d) for d in h["resblock_dilation_sizes"])
    return len(h["upsample_rates"]) * per_stage + 1  # + activation_post


GENERATORS = {
    "tiny": (TINY, 1, 2),
    "resblock2-snake-lin": (dict(TINY, resblock="2", activation="snake", snake_logscale=False,
                                 upsample_rates=[4, 3], upsample_kernel_sizes=[8, 6], upsample_initial_channel=16,
                                 resblock_kernel_sizes=[3, 5], resblock_dilation_sizes=[[1, 3], [1, 2]]), 2, 5),
}


@pytest.mark.parametrize("name", GENERATORS)
def test_fused_generator_matches_eager(name):
    config, batch, frames = GENERATORS[name]
    model = _generator(config).to(DEVICE)
    mel = torch.randn(batch, config["num_mels"], frames, device=DEVICE)
    before_clamp = []  # conv_post's output: the final clamp to [-1, 1] would hide differences
    model.conv_post.register_forward_hook(lambda module, args, out: before_clamp.append(out))
    with torch.no_grad():
        want = model(mel)
        assert fuse_activations(model) == _activation_count(config)
        assert not any(type(m) is Activation1d for m in model.modules())
        got = model(mel)
    assert before_clamp[0].std() > 0.1  # a signal, not the near-silence of the package's init
    torch.testing.assert_close(before_clamp[1], before_clamp[0], **TOL)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("name", GENERATORS)
def test_channels_last_generator_matches_eager(name, monkeypatch):
    """Fused activations and every convolution swapped for its channels-last 2-D form: the package's forward on
    [B, C, 1, T] gives the eager model's waveform. (On a GPU TF32 is off for this comparison: cuDNN picks other
    algorithms for NHWC, and TF32's 10-bit products would differ by more than float rounding.)"""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    config, batch, frames = GENERATORS[name]
    model = _generator(config).to(DEVICE)
    mel = torch.randn(batch, config["num_mels"], frames, device=DEVICE)
    with torch.no_grad():
        want = model(mel)
        with pytest.raises(ValueError, match="fuse the activations first"):
            to_channels_last(model)
        fuse_activations(model)
        convs = sum(isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)) for m in model.modules())
        assert to_channels_last(model) == convs > 0
        got = model(_channels_last(mel))
    assert got.shape == (batch, 1, 1, want.shape[-1])
    torch.testing.assert_close(got[:, :, 0], want, **TOL)


def test_the_480x_preset_has_109_activations():
    h = json.loads(PRESET_480X.read_text())
    model = _generator(h, upsample_initial_channel=64)  # the count does not depend on the width
    assert _activation_count(h) == 109
    assert fuse_activations(model) == 109


# ---------------------------------------------------------------------------------------------------------------
# CUDA: native kernel at real shapes, bf16, graph capture


@needs_cuda
@pytest.mark.parametrize("c,t", [(768, 120), (1536, 24), (24, 46080), (48, 23041)])
def test_cuda_real_shapes_fp32_and_bf16(c, t):
    """fp32 vs eager fp32; bf16 input vs eager fp32 on the same (bf16-rounded) input: only the output rounding
    differs, as the kernel computes in fp32 (eager bf16 would round after every op)."""
    m = _activation("snakebeta", c, True)
    fused = FusedActivation1d.of(m)
    x = torch.randn(2, c, t, device="cuda") * 2
    with torch.no_grad():
        torch.testing.assert_close(fused(x), m(x), **TOL)
        xb = x.bfloat16()
        got = fused(xb)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), m(xb.float()), rtol=1e-2, atol=1e-2)


@needs_cuda
@pytest.mark.parametrize("c,t", [(1536, 24), (48, 23041)])
def test_cuda_channels_last_real_shapes(c, t):
    m = _activation("snakebeta", c, True)
    x = torch.randn(2, c, t, device="cuda") * 2
    with torch.no_grad():
        got = FusedActivation1d.of(m)(_channels_last(x).bfloat16())
        want = m(x.bfloat16().float())
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got[:, :, 0].float(), want, rtol=1e-2, atol=1e-2)


@needs_cuda
def test_cuda_graph_replay():
    m = _activation("snakebeta", 64, True)
    fused = FusedActivation1d.of(m)
    static_x = torch.randn(2, 64, 500, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fused(static_x)  # compile and warm up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = fused(static_x)
        for _ in range(2):
            static_x.copy_(torch.randn_like(static_x) * 2)
            graph.replay()
            torch.testing.assert_close(static_out, anti_aliased_snake(static_x, fused.up_filter, fused.down_filter,
                                                                      fused.alpha, fused.inv_beta), rtol=0, atol=0)
            torch.testing.assert_close(static_out.float(), m(static_x.float()), rtol=1e-2, atol=1e-2)


@needs_cuda
def test_cuda_tiny_generator_bf16_tracks_fp32():
    model = _generator(TINY).cuda()
    mel = torch.randn(2, 80, 24, device="cuda")
    with torch.no_grad():
        want = model(mel)
        fuse_activations(model)
        torch.testing.assert_close(model(mel), want, **TOL)
        got = model.to(torch.bfloat16)(mel.bfloat16()).float()
    snr = 10 * torch.log10(want.pow(2).sum() / (got - want).pow(2).sum()).item()
    assert snr > 25, snr
