"""HiFT's Snake activation, x + sin²(αx)/α per channel, as one kernel.

HiFT runs 72 of them per call (12 resnet blocks of 3 dilations, each two activations). In PyTorch each is seven
kernels (α·x, sin, square, α + 1e-9, its reciprocal, the product, the sum), over half of the ~810 kernels of a
HiFT call; a call of a few windows is bound by running them one after another, not by its arithmetic
(docs/benchmarks.md). Here the activation reads x once and writes it once, in float32 between, rounding
once where PyTorch rounds after every op.

Shapes: x [B, C, T] (any strides), α [C]; the output is [B, C, T] contiguous, in x's dtype.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (CI installs triton; the PyTorch form needs none)
    triton = None

BLOCK_T = 1024  # samples a program: 8 a thread at 4 warps
EPS = 1e-9      # the reference's, in 1/(α + eps)


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """x [B, C, T], α [C] → x + sin²(αx)/(α + 1e-9), [B, C, T]: the kernel on CUDA, the PyTorch form elsewhere."""
    if x.is_cuda and triton is not None:
        return kernel(x, alpha)
    return reference(x, alpha)


def reference(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The reference's form, op by op (in x's dtype)."""
    a = alpha[None, :, None]
    return x + (1.0 / (a + EPS)) * torch.sin(x * a) ** 2


def kernel(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The Triton kernel (on CPU tensors: Triton's interpreter, for the tests)."""
    B, C, T = x.shape
    out = torch.empty(B, C, T, device=x.device, dtype=x.dtype)
    if out.numel():
        grid = (triton.cdiv(T, BLOCK_T), B * C)
        _snake[grid](x, alpha, out, C, T, *x.stride(), alpha.stride(0), BLOCK_T=BLOCK_T, num_warps=4)
    return out


if triton is not None:
    @triton.jit
    def _snake(X, ALPHA, OUT, C, T, sx_b, sx_c, sx_t, s_alpha, BLOCK_T: tl.constexpr):
        row = tl.program_id(1)                         # one channel of one batch row
        b, c = row // C, row % C
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        ok = offs_t < T
        a = tl.load(ALPHA + c * s_alpha).to(tl.float32)
        x = tl.load(X + b * sx_b + c * sx_c + offs_t * sx_t, mask=ok, other=0.0).to(tl.float32)
        s = tl.sin(a * x)                              # libdevice's sinf on sm_90: full range reduction
        y = x + (1.0 / (a + 1e-9)) * (s * s)
        tl.store(OUT + row.to(tl.int64) * T + offs_t, y.to(OUT.dtype.element_ty), mask=ok)
