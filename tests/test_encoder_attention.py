"""The encoder's attention over its slot pool (services/encoder/attention.py): the kernel against its PyTorch form
for streams of every kind in one call (no new frame, a first call, rows past a block, long pasts, slots in any order),
and the keys and values written where the streams' frames are. Without CUDA the kernel runs in Triton's CPU
interpreter (float32, small shapes)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not importable; the encoder attention kernel untested")

from services.encoder.attention import Layout, kernel, reference, write  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")


@pytest.mark.parametrize("streams", [
    [(3, 5, 0)],                                   # (slot, new rows, frames before): a first call
    [(0, 40, 7), (2, 0, 11), (1, 1, 60), (4, 33, 0)],  # rows past a block of 32, none, one, a long past
])
def test_the_kernel_is_the_pytorch_form(streams):
    g = torch.Generator(DEVICE).manual_seed(len(streams))
    H, d, frames, slots = 2, 16, 96, 5
    for dtype in [torch.float32] + ([torch.bfloat16] if CUDA else []):
        k_pool = torch.randn(slots, H, frames, d, generator=g, device=DEVICE).to(dtype)
        v_pool = torch.randn(slots, H, frames, d, generator=g, device=DEVICE).to(dtype)
        rows, at = [], 0
        for _, t, _ in streams:
            rows.append(at)
            at += t
        layout = Layout([s for s, _, _ in streams], rows, [t for _, t, _ in streams], [p for _, _, p in streams], DEVICE)
        q, k, v = (torch.randn(at, H, d, generator=g, device=DEVICE).to(dtype) for _ in range(3))
        write(k_pool, v_pool, k, v, layout)
        for (slot, t, past), row in zip(streams, rows):  # each stream's new keys at its positions, in its slot
            torch.testing.assert_close(k_pool[slot, :, past : past + t], k[row : row + t].transpose(0, 1))
        want = reference(q, k_pool, v_pool, layout)
        tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(kernel(q, k_pool, v_pool, layout), want, **tol)
