"""A CUDA graph of a call, captured the way every service captures its graphs: one eager run first, then the capture.

Why not `torch.cuda.graph` as it comes: on entry it empties the allocator's caches, device and pinned host both
(`torch.cuda.empty_cache`). A service captures tens to hundreds of graphs in a row, so every capture's eager run
then asks the driver for its memory again (cudaMalloc, and under MPS a round trip to its server), and the pinned
blocks the calls copy through are given back and allocated again. Here the caches stay: the eager run's blocks are
reused by the next one, and each graph's own memory comes from the pool it shares with the others, as before.

The eager run is there because some work happens at a kernel's first use only and may not be captured: Triton's
compilation, cuBLAS's workspace, cuDNN's plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")

_capture_streams: dict[int, torch.cuda.Stream] = {}  # one side stream per device: graphs of one pool share it


def capture(fn: Callable[[], T], device: torch.device | int | None = None, pool=None,
            warm_up: bool = True, stream: torch.cuda.Stream | None = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """fn() run once eagerly (unless warm_up is False), then captured → (its graph, the graph's output: the tensors
    fn returned, which every replay overwrites). pool: a memory pool to share (another graph's `pool()`). stream: the
    stream to capture on (default: a side stream of the device's; a green context's own stream for a graph that runs
    there: services/common/green_context.py). One capture at a time in a process, and no other thread's work on the
    device meanwhile (CUDA's global capture mode)."""
    index = _index(device)
    if warm_up:
        with torch.cuda.device(index):
            fn()
    torch.cuda.synchronize(index)
    torch.cuda.current_stream(index).synchronize()  # (under a green context the device's synchronize is not the stream's)
    stream = stream or _capture_streams.get(index)
    if stream is None:
        stream = _capture_streams[index] = torch.cuda.Stream(index)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(index), torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        try:
            out = fn()
        finally:
            graph.capture_end()
    return graph, out


def _index(device: torch.device | int | None) -> int:
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    return d.index if d.index is not None else torch.cuda.current_device()
