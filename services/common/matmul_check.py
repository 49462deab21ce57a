"""Whether this process's matrix products on the GPU are right, checked once before a service serves.

Under CUDA MPS a client capped to a share of the multiprocessors (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: `moss-serve up
--mps-llm-threads`, `--mps-vocoder-threads`) sees fewer of them, and on an H100 (driver 580.159.04, torch 2.11 with
CUDA 13.0) cuBLAS's bf16 products came out wrong, NaN or 20-40% off, at 35, 40, 45, 55, 60 and 75% of its 132
multiprocessors; right at 25, 50 and 100% and without MPS (docs/benchmarks.md). The llm then failed every
request with non-finite logits (what looked like a hang), and a vocoder would make noise of any weights. So each GPU
service multiplies a few bf16 matrices of the model's sizes against float32 before it serves, and refuses to start
when they disagree, naming the share it ran on.
"""

from __future__ import annotations

import os
from collections.abc import Callable

# (in features, out features) of the products checked: the llm's (hidden 4096; K/V 1024; MLP 12288; the audio head
# 16512) cover what failed; the vocoder's and the encoder's are smaller products through the same library.
SHAPES = ((4096, 1024), (4096, 4096), (4096, 6144), (4096, 12288), (4096, 16512), (12288, 4096))
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 201, 256, 512, 2048)  # a decode batch's rows to a prefill's
TOLERANCE = 0.02  # relative error (Frobenius) against float32; bf16 products of these sizes give ~0.002


class MatmulFault(ValueError):
    """Matrix products on the device are wrong in this process: the service must not start."""


def check_matmul(device, shapes=SHAPES, rows=ROWS, linear: Callable | None = None, dtype=None,
                 tolerance: float = TOLERANCE, what: str = "bf16") -> int:
    """Multiply random matrices in `dtype` (default bf16) with `linear` (default F.linear; `what` names its
    products) on `device` and compare with float32 within `tolerance`. → the number of products checked; raises
    MatmulFault naming the first wrong one."""
    import torch

    linear = linear or torch.nn.functional.linear
    dtype = dtype or torch.bfloat16
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(0)
    wrong, first, total = 0, "", 0
    for k, n in shapes:
        w = torch.randn(n, k, device=device, dtype=dtype, generator=g) * k ** -0.5
        for m in rows:
            x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
            ref = x.float() @ w.float().t()
            got = linear(x, w).float()
            err = float((got - ref).norm() / ref.norm()) if bool(torch.isfinite(got).all()) else float("inf")
            total += 1
            if not err <= tolerance:
                wrong += 1
                first = first or f"[{m} x {k}] @ [{k} x {n}] came out {err:.3g} off float32"
    if wrong:
        share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        where = "" if device.type != "cuda" else (
            f" (CUDA MPS: {share}% of the multiprocessors, {torch.cuda.get_device_properties(device).multi_processor_count}"
            f" visible)" if share else f" ({torch.cuda.get_device_name(device)})")
        raise MatmulFault(
            f"matrix products on {device} are wrong in this process{where}: {wrong} of {total} {what} products checked, "
            f"e.g. {first}. Under MPS, cuBLAS has done this on H100s at some shares of the GPU: give this service "
            f"another (--mps-llm-threads / --mps-vocoder-threads: 25, 50 or 100 measured right) (docs/benchmarks.md)")
    return total
