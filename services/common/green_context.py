"""A CUDA green context: a context over a fixed group of the device's multiprocessors, through the driver API.

Why: under MPS a client's share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) is fixed for the life of its process. The llm
needs a quarter of an H200 beside a busy vocoder, and the whole of it when the vocoder is idle (a decode step at
batch 1: 6.1-6.2 ms at 25%, 4.9 ms on the whole GPU: docs/benchmarks.md, llm-share-2026-12-01). A process at 100%
that launches its busy work on a green context's stream gets both, and can move between them from one step to the
next: the driver treats a green context as the primary one for everything but where kernels run (memory, modules,
events), so tensors, Triton's kernels and cuBLAS work in either.

What was measured (H200, driver 580): kernels run on the green group only when they were launched, or their CUDA
graph captured, on a green-context stream with the green context current. A graph captured on the primary context
and replayed on the green stream ran on the whole GPU: each place needs its own graphs. A device synchronize on the
primary context does not wait for a green context's streams: wait on the stream (or an event recorded on it).

The driver calls go through ctypes, in the order PyTorch's own GreenContext uses them (cuDeviceGetDevResource,
cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc, cuGreenCtxCreate, cuCtxFromGreenCtx), plus
cuGreenCtxStreamCreate for a stream that PyTorch takes as an ExternalStream.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager

CU_DEV_RESOURCE_TYPE_SM = 1
CU_GREEN_CTX_DEFAULT_STREAM = 1
CU_STREAM_NON_BLOCKING = 1
DRIVER_NEEDED = 12040          # green contexts came with CUDA 12.4's driver
RESOURCE_BYTES = 1024          # a CUdevResource is 144 bytes in CUDA 12.4's header; room for a later, larger one
SM_COUNT_OFFSET = 96           # CUdevResource: type (4 bytes), 92 bytes of padding, then CUdevSmResource.smCount


class GreenContextUnavailable(RuntimeError):
    """This driver or device cannot make green contexts."""


def driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GreenContextUnavailable(f"no CUDA driver library: {e}") from e


def check(lib: ctypes.CDLL, result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(result, ctypes.byref(name))
        raise GreenContextUnavailable(f"{what} failed: {name.value.decode() if name.value else result}")


def unavailable() -> str | None:
    """Why green contexts cannot be made here (no driver, one older than CUDA 12.4's), or None when they can. Starts
    no context."""
    try:
        lib = driver()
        version = ctypes.c_int()
        check(lib, lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    except GreenContextUnavailable as e:
        return str(e)
    if version.value < DRIVER_NEEDED:
        return f"the CUDA driver is {version.value // 1000}.{version.value % 1000 // 10}; green contexts need 12.4"
    return None


def _sm_count(resource) -> int:
    return int.from_bytes(resource.raw[SM_COUNT_OFFSET:SM_COUNT_OFFSET + 4], "little")


def split(lib: ctypes.CDLL, dev: ctypes.c_int, num_sms: int, part: str = "first"):
    """The device's multiprocessors split into a first group of `num_sms` (rounded up by the driver) and the rest; a
    green context over `part` ("first" or "rest") → (the CUgreenCtx, its CUcontext, the device's multiprocessors,
    the group's). Nothing is made current."""
    whole = ctypes.create_string_buffer(RESOURCE_BYTES)
    check(lib, lib.cuDeviceGetDevResource(dev, whole, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    first, rest = ctypes.create_string_buffer(RESOURCE_BYTES), ctypes.create_string_buffer(RESOURCE_BYTES)
    groups = ctypes.c_uint(1)
    check(lib, lib.cuDevSmResourceSplitByCount(first, ctypes.byref(groups), whole, rest, 0, num_sms),
           "cuDevSmResourceSplitByCount")
    chosen = first if part == "first" else rest
    desc = ctypes.c_void_p()
    check(lib, lib.cuDevResourceGenerateDesc(ctypes.byref(desc), chosen, 1), "cuDevResourceGenerateDesc")
    green = ctypes.c_void_p()
    check(lib, lib.cuGreenCtxCreate(ctypes.byref(green), desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate")
    context = ctypes.c_void_p()
    check(lib, lib.cuCtxFromGreenCtx(ctypes.byref(context), green), "cuCtxFromGreenCtx")
    return green, context, _sm_count(whole), _sm_count(chosen)


class GreenContext:
    """A green context over the device's first `num_sms` multiprocessors (the driver rounds the count up to its
    granularity: `sm_count` is what it gave) and a non-blocking stream in it (`stream`, a torch ExternalStream).
    `current()` makes it the calling thread's context until the block ends; `make_current()`/`release()` do the same
    for code that moves between places step by step."""

    def __init__(self, num_sms: int, device=0):
        import torch  # (not at import: `moss-serve up` asks `unavailable()` without starting PyTorch)

        index = device if isinstance(device, int) else (device.index or 0)
        torch.cuda.init()  # the primary context first: a green context retains it
        lib = self.lib = driver()
        dev = ctypes.c_int()
        check(lib, lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        self.primary = ctypes.c_void_p()
        check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.primary), dev), "cuDevicePrimaryCtxRetain")
        self.green, self.context, self.device_sms, self.sm_count = split(lib, dev, num_sms)
        raw = ctypes.c_void_p()
        check(lib, lib.cuGreenCtxStreamCreate(ctypes.byref(raw), self.green, CU_STREAM_NON_BLOCKING, 0),
               "cuGreenCtxStreamCreate")
        self.stream = torch.cuda.ExternalStream(raw.value, device=torch.device("cuda", index))

    def make_current(self) -> None:
        """The green context current on this thread, its stream PyTorch's current stream."""
        import torch

        check(self.lib, self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        torch.cuda.set_stream(self.stream)

    def release(self, stream) -> None:
        """The primary context current on this thread again, `stream` (a torch.cuda.Stream) PyTorch's current one."""
        import torch

        check(self.lib, self.lib.cuCtxSetCurrent(self.primary), "cuCtxSetCurrent")
        torch.cuda.set_stream(stream)

    @contextmanager
    def current(self):
        import torch

        before = torch.cuda.current_stream()
        self.make_current()
        try:
            yield self
        finally:
            self.release(before)
