"""The FP8 format the llm's GEMMs quantize to (e4m3fn), shared by its numerics (fp8.py) and its kernels
(kernels/fp8.py)."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0   # e4m3fn's largest finite value
TINY = 1e-12      # a row of zeros (padding rows) keeps a finite scale and quantizes to zeros
