"""What a service may allocate at start: its weights must fit the device's free memory, and its pools (the llm's KV
cache, the flow's stream history, the encoder's speaker places) are sized to what is left, or refused with the
arithmetic, before anything large is allocated.

Without this, `moss-serve vocoder --preset moss-speech` on a 24 GB CPU host asked for a stream history sized for a
GPU (128 streams: 23.6 GB in float32) and the kernel's OOM killer ended it without a word. Now:
- weights that do not fit in GIVEN_SHARE of the free memory: the service refuses to start, saying how much they
  need and how much is free;
- a pool of a size the operator gave that does not fit in GIVEN_SHARE of what is free then: refused likewise, with
  the largest size that would;
- a pool left at its default: as many items as fit in POOL_SHARE of the memory free at that point (at most the
  default), logged when fewer. The share leaves room for what the service allocates as it runs (activations, CUDA
  graphs) and, on a host that runs several services, for the others.

Free memory: on CUDA, the device's (torch.cuda.mem_get_info); on the CPU, MemAvailable (/proc/meminfo), or less where
a cgroup (a container's --memory) caps this process lower. `MOSS_MEMORY_FREE_BYTES` replaces the reading (tests, and
an operator who wants a service to plan as if it had less).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

GiB = 1 << 30
POOL_SHARE = 0.5      # of the memory free when a pool is sized, what a default-sized pool may take
GIVEN_SHARE = 0.9     # of the memory free, what weights or a pool of a given size may take (the rest: activations)
FREE_ENV = "MOSS_MEMORY_FREE_BYTES"


class NotEnoughMemory(ValueError):
    """The service cannot start: what it would allocate does not fit (a ValueError: `moss-serve` prints it in one
    line and exits 2)."""


def gb(n: float) -> str:
    """Bytes for a message: GB with one decimal, MB under 1 GB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def free_bytes(device) -> int:
    """Memory free for this process on `device` (a torch.device or a --device string) now."""
    if (given := os.environ.get(FREE_ENV)) is not None:
        return int(float(given))
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    return _host_free()


def _host_free() -> int:
    available = _meminfo("MemAvailable")
    limit = _cgroup_room()
    return min(available, limit) if limit is not None else available


def _meminfo(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/meminfo has no {field}")


def _cgroup_room() -> int | None:
    """What the process's cgroup lets it allocate still (v2, else v1), None where it sets no limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # (v1's "no limit" is a huge number)
            return None
        return max(0, int(limit) - int(usage))
    return None


@dataclass(frozen=True)
class Pool:
    """A pool a service allocates at start, for messages: what it is, the flag that sizes it, and its items' unit."""

    service: str     # "vocoder"
    what: str        # "the flow's stream history"
    flag: str        # "--flow-history-streams"
    unit: str        # "streams"


def check_weights(service: str, what: str, nbytes: int, device, advice: str) -> None:
    """NotEnoughMemory unless `nbytes` of weights fit in GIVEN_SHARE of the memory free on `device`."""
    free = free_bytes(device)
    if nbytes > GIVEN_SHARE * free:
        raise NotEnoughMemory(f"{service}: {what} need {gb(nbytes)}, and {gb(free)} is free on {device}: {advice}")


def size_pool(pool: Pool, per_item: int, given: int | None, default: int, device, least: int = 1) -> int:
    """How many items the pool gets: `given` if it fits GIVEN_SHARE of the memory free on `device` (else
    NotEnoughMemory, saying the most that would), or without one as many as fit in POOL_SHARE of it, at most
    `default` (at least `least`, else NotEnoughMemory)."""
    free = free_bytes(device)
    if given is not None:
        if given * per_item > GIVEN_SHARE * free:
            raise NotEnoughMemory(
                f"{pool.service}: {pool.what} for {given} {pool.unit} needs {gb(given * per_item)} "
                f"({gb(per_item)} each), and {gb(free)} is free on {device}: give {pool.flag} "
                f"{int(GIVEN_SHARE * free) // per_item} or less")
        return given
    fits = int(POOL_SHARE * free) // per_item
    if fits < least:
        raise NotEnoughMemory(
            f"{pool.service}: {pool.what} needs {gb(least * per_item)} at least ({least} {pool.unit}), and "
            f"{gb(free)} is free on {device}")
    if fits < default:
        log.warning("%s: %s holds %d %s, not %d: %s each, and %s is free on %s (a default size takes at most "
                    "half of it; give %s to choose)", pool.service, pool.what, fits, pool.unit, default, gb(per_item),
                    gb(free), device, pool.flag)
        return fits
    return default


def size_gib(pool: Pool, given: float | None, default: float, device) -> float:
    """A pool sized in GiB (the llm's KV cache): `given` if it fits GIVEN_SHARE of the memory free on `device` (else
    NotEnoughMemory, saying the most that would), or without one `default`, or as much as fits in POOL_SHARE of it
    if less."""
    free = free_bytes(device)
    if given is not None:
        if given * GiB > GIVEN_SHARE * free:
            most = int(GIVEN_SHARE * free / GiB * 10) / 10
            raise NotEnoughMemory(f"{pool.service}: {pool.what} of {given:g} GiB needs {gb(given * GiB)}, and "
                                  f"{gb(free)} is free on {device}: give {pool.flag} {most:g} or less")
        return given
    fits = POOL_SHARE * free / GiB
    if fits < default:
        log.warning("%s: %s takes %.2f GiB, not %g: %s is free on %s (a default size takes at most half of it; give "
                    "%s to choose)", pool.service, pool.what, fits, default, gb(free), device, pool.flag)
        return fits
    return default
