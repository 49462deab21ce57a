"""The encoder's keys and values: a slot per open segment (a speaker's current 30 s), every layer's keys and values
at the segment's frame positions.

    k, v: [layers, slots, heads, max_source_positions, head_dim]

A segment's frames are at most max_source_positions (1500 at the real size), so a slot is sized for a whole one:
2 · 16 · 1500 · 1280 values, 123 MB in bf16 at the real size. `slots` bounds the speakers encoded at once; a speaker
beyond it is refused (PoolFull) rather than waiting, since its words would come late. With `scratch`, one more slot
is kept aside for no speaker: the rows that pad a CUDA graph's bucket write there (graphs.py).
"""

from __future__ import annotations

import math

import torch

from services.encoder.config import WhisperVQConfig


class PoolFull(RuntimeError):
    pass


class KVPool:
    @staticmethod
    def shape(cfg: WhisperVQConfig, slots: int, frames: int | None = None) -> tuple[int, ...]:
        """k's and v's shape each: [layers, slots, heads, frames, head_dim]."""
        heads = cfg.encoder_attention_heads
        return cfg.quantize_position, slots, heads, frames or cfg.max_source_positions, cfg.d_model // heads

    @staticmethod
    def bytes_per_slot(cfg: WhisperVQConfig, dtype: torch.dtype, frames: int | None = None) -> int:
        """What one slot costs (keys and values of every layer), for sizing `slots` before allocating them."""
        return 2 * math.prod(KVPool.shape(cfg, 1, frames)) * dtype.itemsize

    def __init__(self, cfg: WhisperVQConfig, slots: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, frames: int | None = None, scratch: bool = False):
        """frames: positions a slot holds (default: a whole segment's); scratch: a slot more, `self.scratch`, that
        is never taken."""
        self.slots = slots
        self.scratch = slots if scratch else None
        shape = self.shape(cfg, slots + scratch, frames)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.free = list(range(slots - 1, -1, -1))
        self.borrowed = 0  # slots a whole segment's encoding holds for its call (WhisperVQEncoder.forward): no speaker's

    @property
    def frames(self) -> int:
        return self.k.shape[3]

    def take(self) -> int:
        if not self.free:
            raise PoolFull(f"all {self.slots} encoder slots are in use")
        return self.free.pop()

    def give(self, slot: int) -> None:
        self.free.append(slot)

    def used(self) -> int:
        return self.slots - len(self.free)

    def speakers(self) -> int:
        """The slots speakers hold (`used` less those borrowed for a call; read from another thread, so never under 0)."""
        return max(0, self.used() - self.borrowed)
