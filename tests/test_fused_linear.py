"""The feed-forward's first product with its GELU in one kernel (codec/fused_linear.py) against PyTorch's product
and exact GELU. Without CUDA the kernel runs in Triton's CPU interpreter (float32); with CUDA also in bfloat16 at the
estimator's widths and call sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not importable; the codec's fused product untested")

from test_frame_ops import DEVICE, DTYPES, tolerance  # noqa: E402

from services.vocoder.codec import frame_ops, fused_linear  # noqa: E402

CUDA = torch.cuda.is_available()
# (frames B x T, product K → N): odd sizes (masks); with CUDA the estimator's feed-forward at 1 and 6 streams' calls
SHAPES = [(2, 19, 40, 24), (3, 7, 70, 150)] + ([(2, 80, 256, 1024), (12, 80, 256, 1024)] if CUDA else [])


def product(B, T, K, N, dtype, seed):
    gen = torch.Generator(DEVICE).manual_seed(seed)
    x = torch.randn(B, T, K, generator=gen, device=DEVICE).to(dtype)
    weight = (torch.randn(N, K, generator=gen, device=DEVICE) / K ** 0.5).to(dtype)
    bias = torch.randn(N, generator=gen, device=DEVICE).to(dtype)
    return x, weight, bias


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("B,T,K,N", SHAPES)
def test_linear_gelu_is_the_product_then_exact_gelu(B, T, K, N, with_bias, dtype):
    x, weight, bias = product(B, T, K, N, dtype, seed=K + N)
    bias = bias if with_bias else None
    with torch.inference_mode():
        got = fused_linear.kernel(x, weight, bias)
        want = F.gelu(F.linear(x, weight, bias))                        # PyTorch, rounding after each op
        exact = F.gelu(F.linear(x.float(), weight.float(), None if bias is None else bias.float()))
    assert got.shape == (B, T, N) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **tolerance(dtype))
    if dtype != torch.float32:  # rounded once, not twice: no further from float32's than PyTorch's
        assert (got.float() - exact).abs().mean() <= 1.05 * (want.float() - exact).abs().mean()


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gelu_is_exact_not_the_tanh_form(dtype):
    x, weight, bias = product(2, 19, 40, 24, dtype, seed=7)
    x[0, 0] = 0.0                                     # a frame of zeros: GELU(bias), at the tails too
    bias[:3] = torch.tensor([-6.0, 0.0, 6.0], dtype=dtype, device=DEVICE)
    with torch.inference_mode():
        got = fused_linear.kernel(x, weight, bias).float()
        h = F.linear(x.float(), weight.float(), bias.float())
        want, tanh_form = F.gelu(h), F.gelu(h, approximate="tanh")
    torch.testing.assert_close(got, want, **tolerance(dtype))
    if dtype == torch.float32:                        # they differ by ~1e-3; the kernel by ~1e-6
        assert (got - tanh_form).abs().max() > 100 * (got - want).abs().max()


def test_linear_gelu_runs_pytorch_on_cpu_and_when_off(monkeypatch):
    x, weight, bias = product(2, 5, 16, 8, torch.float32, seed=1)
    want = F.gelu(F.linear(x, weight, bias))
    torch.testing.assert_close(fused_linear.linear_gelu(x, weight, bias), want)   # CPU: PyTorch
    calls = []
    monkeypatch.setattr(fused_linear, "kernel", lambda *a: calls.append("kernel"))
    monkeypatch.setattr(frame_ops, "on_gpu", lambda t: True)
    fused_linear.linear_gelu(x, weight, bias)
    assert calls == ["kernel"]
    monkeypatch.setattr(fused_linear, "FUSED", False)
    torch.testing.assert_close(fused_linear.linear_gelu(x, weight, bias), want)
    assert calls == ["kernel"]


def test_programmatic_launch_only_on_cuda_devices_that_have_it(monkeypatch):
    from services.common import launch

    assert not launch.pdl(torch.zeros(1))                                        # CPU: Triton's interpreter
    if CUDA:
        capable = torch.cuda.get_device_capability()[0] >= 9
        assert launch.pdl(torch.zeros(1, device="cuda")) == capable
        monkeypatch.setattr(launch, "ENABLED", False)
        assert not launch.pdl(torch.zeros(1, device="cuda"))
