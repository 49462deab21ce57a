"""Fused Triton kernels (services/llm/runner/kernels/fused.py) against the reference model's ops.

Without CUDA the kernels run in Triton's CPU interpreter at tiny shapes in float32; with CUDA they run natively
at the real shapes (hidden 4096, 32/8 heads of 128) in float32 and bf16.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first @triton.jit

try:
    import triton  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"test_fused_kernels skipped: triton is not importable ({e})")
    pytest.skip(f"triton is not importable ({e})", allow_module_level=True)

import torch.nn.functional as F

from services.llm.model.model import RMSNorm, rotate_neox
from services.llm.runner.kernels.fused import qk_norm_rope_store, rms_norm, rope_cache, silu_mul

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16] if CUDA else [torch.float32]
ROWS = [1, 7, 64, 512] if CUDA else [1, 7, 64]
# (hidden, heads, kv_heads, head_dim, intermediate)
HIDDEN, H, KH, D, INTER = (4096, 32, 8, 128, 12288) if CUDA else (64, 4, 2, 16, 96)
EPS, THETA = 1e-6, 1e6
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def _norm(dim: int, dtype) -> RMSNorm:
    """The reference RMSNorm with a random (not ones) weight, in the model dtype as a checkpoint loads it."""
    m = RMSNorm(dim, EPS)
    with torch.no_grad():
        m.weight.copy_(torch.rand(dim) + 0.5)
    return m.to(DEVICE, dtype)


def _qk_tol(ref: torch.Tensor) -> dict:
    """bf16: the reference rounds the normed q/k to bf16 before RoPE, and a last-bit fp32 difference in the norm
    (reduction order, rsqrt) can flip that rounding by one bf16 ulp (~1 in 10^5 elements), which RoPE carries into
    outputs that may cancel to ~0. So allow one bf16 ulp of the largest value on top of 1e-2 relative."""
    if ref.dtype != torch.bfloat16:
        return TOL[ref.dtype]
    return dict(rtol=1e-2, atol=max(1e-2, 2**-7 * ref.abs().max().item()))


def _nan(*shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("hidden", [HIDDEN, 100])  # 100: BLOCK 128 with a masked tail
def test_rms_norm(n, hidden, dtype):
    norm = _norm(hidden, dtype)
    x = torch.randn(n, hidden, device=DEVICE).to(dtype)
    out = rms_norm(x, norm.weight, EPS, out=_nan(n, hidden, dtype=dtype))
    assert out.isfinite().all()
    torch.testing.assert_close(out, norm(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("hidden", [HIDDEN, 100])
def test_rms_norm_residual(n, hidden, dtype):
    norm = _norm(hidden, dtype)
    x = torch.randn(n, hidden, device=DEVICE).to(dtype)
    residual = torch.randn(n, hidden, device=DEVICE).to(dtype)
    new_residual = x + residual  # the reference's residual stream, rounded to dtype
    res = residual.clone()
    out, res_out = rms_norm(x, norm.weight, EPS, residual=res, out=_nan(n, hidden, dtype=dtype))
    assert res_out is res and out.isfinite().all()
    torch.testing.assert_close(res, new_residual, rtol=0, atol=0)  # fp32 add, one rounding: exact
    torch.testing.assert_close(out, norm(new_residual), **TOL[dtype])


def test_rms_norm_in_place():
    """out=x: the row is read fully before it is overwritten."""
    norm = _norm(HIDDEN, torch.float32)
    x = torch.randn(7, HIDDEN, device=DEVICE)
    ref = norm(x)
    assert rms_norm(x, norm.weight, EPS, out=x) is x
    torch.testing.assert_close(x, ref, **TOL[torch.float32])


def test_rope_cache_matches_rotate_neox_bitwise():
    max_pos = 4096
    cos_sin = rope_cache(D, max_pos, THETA, DEVICE)
    assert cos_sin.shape == (max_pos, D // 2, 2) and cos_sin.dtype == torch.float32
    positions = torch.randint(0, max_pos, (33,), device=DEVICE)
    x = torch.randn(33, 3, D, device=DEVICE)
    cos, sin = cos_sin[positions, :, 0].repeat(1, 2)[:, None], cos_sin[positions, :, 1].repeat(1, 2)[:, None]
    rotated = torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1)
    assert torch.equal(x * cos + rotated * sin, rotate_neox(x, positions, THETA))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
def test_qk_norm_rope_store(n, dtype):
    block_size, num_layers, layer, max_pos = (16 if CUDA else 4), 3, 1, 4096
    num_blocks = -(-n // block_size) + 3
    q_norm, k_norm = _norm(D, dtype), _norm(D, dtype)
    qkv = torch.randn(n, (H + 2 * KH) * D, device=DEVICE).to(dtype)
    positions = torch.randint(0, max_pos, (n,), device=DEVICE)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:n]  # distinct, across several blocks
    if n > 1:
        slots[torch.randperm(n, device=DEVICE)[: max(1, n // 4)]] = -1  # padding rows: store nothing
    kv = torch.randn(num_blocks, num_layers, 2, KH, block_size, D, device=DEVICE).to(dtype)
    before = kv.clone()

    cos_sin = rope_cache(D, max_pos, THETA, DEVICE)
    q_out = qk_norm_rope_store(qkv, q_norm.weight, k_norm.weight, EPS, positions, cos_sin, kv, layer, slots, H, KH, D,
                               q_out=_nan(n, H, D, dtype=dtype))

    # Reference: Attention.forward of model.py on the split projections.
    q, k, v = qkv.split([H * D, KH * D, KH * D], -1)
    q_ref = rotate_neox(q_norm(q.reshape(n, H, D)), positions, THETA)
    k_ref = rotate_neox(k_norm(k.reshape(n, KH, D)), positions, THETA)
    v_ref = v.reshape(n, KH, D)
    assert q_out.isfinite().all()
    torch.testing.assert_close(q_out, q_ref, **_qk_tol(q_ref))

    stored = slots >= 0
    blocks, offsets = slots[stored] // block_size, slots[stored] % block_size
    torch.testing.assert_close(kv[blocks, layer, 0, :, offsets], k_ref[stored], **_qk_tol(k_ref))
    torch.testing.assert_close(kv[blocks, layer, 1, :, offsets], v_ref[stored], rtol=0, atol=0)  # a copy
    written = torch.zeros(kv.shape[:5], dtype=torch.bool, device=DEVICE)
    written[blocks, layer, :, :, offsets] = True
    assert torch.equal(kv[~written], before[~written])  # other slots, other layers, padding rows: untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
def test_silu_mul(n, dtype):
    gate_up = (torch.randn(n, 2 * INTER, device=DEVICE) * 3).to(dtype)
    out = silu_mul(gate_up, out=_nan(n, INTER, dtype=dtype))
    assert out.isfinite().all()
    gate, up = gate_up.chunk(2, -1)
    torch.testing.assert_close(out, F.silu(gate) * up, **TOL[dtype])
