"""Whether the accelerator a service computes on still works.

A CUDA error such as an illegal memory access is sticky: every later call on that context fails too. Seen on
an H100 (docs/benchmarks.md): one llm replica SIGKILLed under load, and the other, a client of the
same MPS server, failed every step after it while its health check still said SERVING. So a service whose
work fails asks `lost()` (and so does one idle for PROBE_SECONDS); if its device is gone, it fails what it holds
with DeviceLost (UNAVAILABLE: the
gateway starts a turn not yet answered again elsewhere), stops serving and exits, and what supervises it
(`moss-serve up`, compose's restart policy) starts it again on a fresh context.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

# torch is imported in lost(), not here: `moss-serve` and the gateway read PROBE_SECONDS through the settings, and
# start ~2 s sooner without it.
if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Idle, a service asks every so often whether its device still works: under MPS a fault in another client of
# its server reaches this one's context too, and a faulted server takes no new client until every old one is
# gone, so an idle client that kept its broken context would keep the GPU from coming back. Every second: a probe is a
# sync and one tiny kernel, and on an H200 a vocoder's SIGKILL that faulted the idle llm was found 5.5 s later with a
# probe every 5 s, the restart of every GPU stage waiting on it (docs/benchmarks.md, start-2026-11-29).
PROBE_SECONDS = 1.0


def unusable(device: str) -> str | None:
    """Why `device` (a --device value) cannot be computed on here, said for a person; None where it can. A CUDA
    device needs a CUDA build of torch and a GPU this process sees (else PyTorch's own error, pages long, comes at the
    first kernel)."""
    if not device.startswith("cuda"):
        return None
    import torch

    if torch.version.cuda is None:
        return f"--device {device}: this torch ({torch.__version__}) is built without CUDA; install a CUDA build"
    if not torch.cuda.is_available():
        return f"--device {device}: no CUDA GPU is visible to this process (torch {torch.__version__}, CUDA {torch.version.cuda})"
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        return f"--device {device}: this process sees {torch.cuda.device_count()} GPU(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}"
    return None


def use_cpu_threads(service: str, threads: int | None) -> None:
    """Run torch's CPU math on `threads` threads (None: torch's default, every core). Several stages on one machine's
    cores each taking all of them played the 2 turns of a burst on 2 cores with a stall in 16 of 24 bursts, against 0 of
    17 at a core each (docs/benchmarks.md, cpu-threads-2026-11-30): their threads wait on one another's."""
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
    log.info("%s: torch's CPU math on %d thread(s)", service, threads)


def open_context(service: str, device: str) -> None:
    """Make this process's context on a CUDA `device` now and log how long it took (nothing on a CPU). A GPU stage's
    start logs it apart from its models' steps: under MPS a context is a client of the server, and after a fault a new
    server (bench/restart_report.py reads the line)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return
    started = time.perf_counter()
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    log.info("%s: its CUDA context made in %.1f s", service, time.perf_counter() - started)


def lost(device: torch.device | str) -> bool:
    """True if `device` no longer runs work (a CPU never is). Waits for the work queued on it."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except Exception:  # noqa: BLE001  whatever the driver raises, the context cannot be used
        return True
    return False


def fatal_signal(loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Future, Callable[[Exception], None]]:
    """→ (a future for serve(fatal=...), the callback a worker thread reports its lost device through)."""
    fatal = loop.create_future()

    def report(err: Exception) -> None:
        loop.call_soon_threadsafe(lambda: fatal.done() or fatal.set_exception(err))

    return fatal, report
