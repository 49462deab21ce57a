"""Host → device copies that never stall the host: staged through pinned memory (from torch's caching
host allocator) so that `non_blocking` holds; a copy from pageable memory may wait for the stream."""

from __future__ import annotations

import torch


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
