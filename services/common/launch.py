"""Programmatic dependent launch (PDL) for our Triton kernels, on GPUs that have it (compute capability 9+).

A flow call of the vocoder is ~6,000 kernels of a few microseconds each, and an llm decode step ~360, one after
another in CUDA graphs (docs/benchmarks.md). Between two of them the GPU waits for the first to drain,
then launches the second and schedules its programs; beside the other service's work under MPS that gap grows with
every kernel. With PDL a kernel is launched while the one before it still runs: its programs start, wait
(`griddepcontrol.wait`) until the kernel before has finished and its writes are visible, then let the next kernel
launch (`griddepcontrol.launch_dependents`). Only kernels that both wait and are launched this way overlap, so
`pdl()` decides both: a kernel launched with it must call `inputs_ready(PDL)` before its first load of anything
an earlier kernel writes (loads of what none writes, such as weights, may come before it).

Measured on an H100 (docs/benchmarks.md): alone a flow call is no faster (the gap between two kernels in a
graph is under a microsecond), but beside the llm it is: a 6-window call 77-78 → 74 ms (bench/studies/gpu_sharing.py
--flow-variant), in the stack ~77 → ~69 ms a call, and 15-22% more turns admitted at Poisson 30/s. Triton's products that wait
before every load were slower than cuBLAS's at these sizes; ones that load their weights before the wait (nothing
before them writes weights) are faster at a stream's few frames: a first flow call 24.6 → 18.7-19.0 ms on an H200
(codec/prefetch_linear.py). The llm's kernels launch so too (its norms, q/k norm with RoPE, attention, activation,
sampling).

Safe by order: kernel n+1 starts after kernel n let it, which is after kernel n's wait returned, which is after kernel
n-1 finished. So when a kernel's wait returns, every kernel before it has finished, whatever it wrote.
"""

from __future__ import annotations

from functools import lru_cache

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover (CI installs triton; the PyTorch forms need none)
    triton = None

ENABLED = True   # False: plain launches (bench/studies/codec_flow_profile.py and bench/studies/gpu_sharing.py compare, per process)


def pdl(x: torch.Tensor) -> bool:
    """Whether a kernel over x launches with PDL (and so waits in `inputs_ready`): on CUDA devices of compute
    capability 9+ (Triton's interpreter on CPU, and older GPUs, launch plainly)."""
    return ENABLED and x.is_cuda and _capable(x.device.index if x.device.index is not None else torch.cuda.current_device())


@lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


if triton is not None:
    @triton.jit
    def inputs_ready(PDL: tl.constexpr):
        """Before a kernel's first load: wait until the kernel before has finished and its writes are visible, then
        let the next kernel launch. A no-op without PDL."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
