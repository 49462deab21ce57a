"""HiFT's Snake as one kernel (codec/snake.py) against the reference's form, alone and inside a whole HiFT call.
Without CUDA the kernel runs in Triton's CPU interpreter (float32); with CUDA also in bfloat16."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not importable; HiFT's snake kernel untested")

from services.vocoder.codec import hift as hift_module  # noqa: E402
from services.vocoder.codec import snake  # noqa: E402
from services.vocoder.codec.config import tiny  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")


def inputs(B, C, T, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = 4 * torch.randn(B, C, T, generator=gen)
    x[0, 0, :3] = torch.tensor([-300.0, 250.0, 1e-4])  # sin's range reduction far out, and near zero
    alpha = torch.rand(C, generator=gen) * 3
    alpha[0] = 1e-6                                      # sin²(αx)/α → αx² as α → 0
    return x.to(DEVICE, dtype), alpha.to(DEVICE, dtype)


@pytest.mark.parametrize("B,C,T", [(2, 3, 1500), (1, 8, 7), (3, 5, 1024)])
def test_the_kernel_is_the_reference_form(B, C, T):
    x, alpha = inputs(B, C, T, B * C + T)
    got, want = snake.kernel(x, alpha), snake.reference(x, alpha)
    assert got.shape == (B, C, T) and got.is_contiguous()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_the_kernel_reads_any_strides():
    """A view (time not contiguous) in, the contiguous result out."""
    x, alpha = inputs(2, 4, 33, 7)
    view = x.transpose(1, 2).contiguous().transpose(1, 2)   # [B, C, T] with channels fastest
    assert not view.is_contiguous()
    torch.testing.assert_close(snake.kernel(view, alpha), snake.reference(x, alpha), atol=1e-4, rtol=1e-5)


def test_an_empty_input_gives_an_empty_output():
    x, alpha = inputs(1, 3, 4, 0)
    assert snake.kernel(x[:, :, :0], alpha).shape == (1, 3, 0)


@pytest.mark.skipif(not CUDA, reason="bfloat16 on the GPU only")
def test_bfloat16_rounds_once():
    """In bf16 the kernel computes in float32 and rounds once: closer to the float32 answer than the op-by-op form."""
    x, alpha = inputs(2, 64, 6000, 3, torch.bfloat16)
    exact = snake.reference(x.float(), alpha.float())
    got, ops = snake.kernel(x, alpha).float(), snake.reference(x, alpha).float()
    assert (got - exact).norm() <= (ops - exact).norm()
    torch.testing.assert_close(got, exact, atol=0.1, rtol=1e-2)


def test_a_hift_call_through_the_kernel_is_the_reference_form(monkeypatch):
    """The whole generator (tiny layout, a window with its source's conditions) with every Snake through the kernel
    equals it with the reference's form."""
    torch.manual_seed(0)
    model = hift_module.HiFTGenerator(tiny().hift).eval().to(DEVICE)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, hift_module.Snake):
                m.alpha.uniform_(0.2, 2.0)
    B, F = 2, 24
    mel = torch.randn(B, 80, F, device=DEVICE) - 4
    conds = (torch.rand(B, model.m_source.harmonics, device=DEVICE), torch.tensor([3, 0], device=DEVICE),
             torch.tensor([F - 4, F - 4], device=DEVICE), torch.tensor([4800, 0], device=DEVICE))
    with torch.inference_mode():
        monkeypatch.setattr(hift_module, "snake", snake.reference)
        (want, want_phase) = model(mel, *conds)
        monkeypatch.setattr(hift_module, "snake", snake.kernel)
        (got, got_phase) = model(mel, *conds)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_phase, want_phase)
