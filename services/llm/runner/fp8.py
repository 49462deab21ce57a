"""FP8 layer GEMMs for the kernel runner (`--quantization fp8`): W8A8 in e4m3, a scale per output channel of each
weight (made once, at load) and per row of each activation (made at every GEMM, from the row's own largest value).

Why: a decode step reads every weight of the audio path once (14 GB in bf16, DESIGN.md §5), and beside the vocoder
under MPS the llm has a quarter of the multiprocessors, so its steps are bound by bytes and by tensor-core work
alike. In e4m3 both halve. The embeddings, norms, attention, K/V and the two heads stay in the model's dtype: the
heads make the logits that are sampled, and they are a small part of a step (the text head runs only for rows that
sample text).

Shapes: x [M, K] in the model's dtype, weight [N, K] → [M, N] in x's dtype. On CUDA the product is a Triton kernel up
to DECODE_ROWS rows (kernels/fp8.py) and torch._scaled_mm above (cuBLASLt, row-wise scales: H100 and newer);
elsewhere the same quantized numbers are multiplied in float32, so CPU tests hold the arithmetic to the reference
(tests/test_fp8.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.llm.runner.fp8_format import FP8, FP8_MAX, TINY


@dataclass
class Fp8Weight:
    data: torch.Tensor   # [N, K] FP8, row-major: data.t() is the column-major [K, N] that _scaled_mm takes
    scale: torch.Tensor  # [1, N] float32: weight ≈ data · scale, per output channel

    @classmethod
    def of(cls, weight: torch.Tensor) -> "Fp8Weight":
        data, scale = quantize_rows_reference(weight)
        return cls(data, scale.view(1, -1))

    def dequantized(self) -> torch.Tensor:
        """[N, K] float32: what the FP8 weight stands for."""
        return self.data.float() * self.scale.t()

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] → (q [M, K] FP8, scale [M, 1] float32) with x ≈ q · scale, each row scaled to its largest value.
    Detached: a Parameter's autograd graph would keep a float32 copy of every weight alive."""
    v = x.detach().float()
    scale = v.abs().amax(dim=1, keepdim=True).clamp(min=TINY) / FP8_MAX
    return (v / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).contiguous(), scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows_reference in one kernel on CUDA (inside a captured step: ~150 GEMMs a step)."""
    if x.is_cuda:
        from services.llm.runner.kernels.fp8 import quantize_rows as kernel

        return kernel(x)
    return quantize_rows_reference(x)


# Up to this many rows (decode steps, short prefills) a product is bound by reading its weight, and cuBLASLt's FP8
# kernels read it slowly: kernels/fp8.py's decode kernel takes them. More rows go to torch._scaled_mm. The same
# arithmetic.
DECODE_ROWS = 64


def linear(x: torch.Tensor, weight: torch.Tensor | Fp8Weight) -> torch.Tensor:
    """F.linear(x, weight) for either kind of weight: x [M, K], weight [N, K] → [M, N] in x's dtype."""
    if not isinstance(weight, Fp8Weight):
        return F.linear(x, weight)
    q, scale = quantize_rows(x)
    if x.is_cuda:
        if x.shape[0] <= DECODE_ROWS:
            from services.llm.runner.kernels.fp8 import decode_matmul

            return decode_matmul(q, scale, weight.data, weight.scale, x.dtype)
        return torch._scaled_mm(q, weight.data.t(), scale_a=scale, scale_b=weight.scale, out_dtype=x.dtype)
    return ((q.float() * scale) @ weight.dequantized().t()).to(x.dtype)


# A W8A8 product of random data comes out ~0.037 off float32 (e4m3 keeps 3 bits of mantissa); wrong products under
# MPS (services/common/matmul_check.py) were 0.2 off or more, or not finite.
CHECK_TOLERANCE = 0.08


def check_fp8(device, **sizes) -> int:
    """matmul_check's products (or `sizes`: its shapes and rows) through `linear` with FP8 weights: → the number
    checked; raises MatmulFault."""
    from services.common.matmul_check import check_matmul

    return check_matmul(device, linear=lambda x, w: linear(x, Fp8Weight.of(w)), tolerance=CHECK_TOLERANCE, what="FP8",
                        **sizes)
