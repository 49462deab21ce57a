"""A process's CUDA work on a fixed set of multiprocessors: a CUDA green context, made current before PyTorch starts
(for `bench/studies/gpu_sharing.py --green-llm-sms`).

Under MPS a client's share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) limits how many multiprocessors its kernels occupy at
once, not which: the llm's kernels and the vocoder's land on the same ones and slow each other (a neighbor that only
spins in registers at 25% slowed the vocoder's calls to 0.4 of their speed). Static MPS partitions
(`nvidia-cuda-mps-control -S`) need a newer driver than 580. A green context is a context over a given group of
multiprocessors. Both processes split the device the same way, by the driver's own deterministic split: the llm takes
the first group of N, the vocoder the rest, so the two sets do not overlap.

The driver API through ctypes, in the order PyTorch's own GreenContext uses it (cuDeviceGetDevResource,
cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc, cuGreenCtxCreate, cuCtxFromGreenCtx), then cuCtxSetCurrent
on the calling thread: the runtime, and so PyTorch, uses the context current on a thread. Only this thread's work
is confined; other threads would start on the primary context.
"""

from __future__ import annotations

import ctypes

import bench_path  # noqa: F401  (bench/ and the tree on the import path)

from services.common.green_context import check, driver, split


def make_current(num_sms: int, part: str, device_index: int = 0) -> None:
    """Split the device's multiprocessors into a first group of `num_sms` and the rest; make a green context over
    `part` ("first" or "rest") current on this thread. (How many it holds: gpu_neighbors.sm_ids, from a kernel.)"""
    lib = driver()
    check(lib, lib.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(lib, lib.cuDeviceGet(ctypes.byref(device), device_index), "cuDeviceGet")
    _, context, _, _ = split(lib, device, num_sms, part)
    check(lib, lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")
