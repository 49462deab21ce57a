"""What the benchmarks share: host timing around a synchronised device, and the SNR of one output against another."""

from __future__ import annotations

import datetime
import statistics
import time

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def times(fn, reps: int, device: torch.device) -> list[float]:
    """Seconds of each of reps runs of fn(), after one warm-up, the device synchronised around each."""
    fn()
    sync(device)
    out = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return out


def median_time(fn, reps: int, device: torch.device) -> float:
    return statistics.median(times(fn, reps, device))


def graph_time(fn, repeats: int, reps: int, device: torch.device) -> float:
    """Median seconds of replaying `repeats` calls of fn() captured in one CUDA graph (fn run once before, outside
    the capture: it compiles and allocates there)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    return median_time(graph.replay, reps, device)


def snr_db(ref: torch.Tensor, x: torch.Tensor) -> float:
    ref, x = ref.float().cpu(), x.float().cpu()
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - x).pow(2).sum().clamp(min=1e-30)))


def gpu_record(**fields) -> dict:
    """The head of a GPU benchmark's JSON: when, on what, with which torch, the bench's own fields; its cells to fill."""
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, **fields, "cells": {}}


def timed(fn, reps: int = 20) -> float:
    fn()
    if not torch.cuda.is_available():  # a smoke run on CPU: wall time
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - start) / reps
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def matmul_rate() -> float:
    """The GPU's bf16 matrix rate (FLOP/s), measured on an 8192³ product."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192 ** 3 / timed(lambda: a @ b, 10)
