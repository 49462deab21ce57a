"""The encoder's layers replayed from CUDA graphs: one replay a call instead of ~230 launches.

A call's rows (every speaker's new frames, packed: whisper_vq.py) go through the positions and the 16 layers. On the
GPU that is ~14 kernels a layer, and at the few rows a streamed call has (a 100 ms chunk is 5 frames a speaker) the
launches, not the arithmetic, are its time. So the layers are captured once per bucket of rows, over static inputs:

    rows [R, dim]                                      a call's N ≤ R rows first; the rest padding
    one int32 buffer, on the host (pinned) and the device, copied in one transfer a call:
        positions [R_max] | row_slots [R_max] | blocks [B_max, 2] | meta [4, S + 1]

Padding rows write their keys and values to the pool's scratch slot (KVPool(scratch=True): never a speaker's) and are
read by nobody; their outputs are dropped. A bucket's grid has room for every block its rows can make
(R / BLOCK_M + S); blocks beyond the call's point at meta's last column, a stream of no rows, and do nothing. Rows
are independent in every layer but the attention, which reads only its own stream's slot, so a call gives what the
eager layers give for the same rows.
"""

from __future__ import annotations

import torch

from services.common.cuda_graph import capture
from services.encoder.attention import BLOCK_M
from services.encoder.kv_pool import KVPool

ROW_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)  # a call of more rows (a long chunk at once): eager


class StaticLayout:
    """attention.Layout's device tensors as views of one static buffer (the graphs read them where they were
    captured): a bucket's first `rows` rows and `blocks` blocks, and meta whole."""

    def __init__(self, buffer: torch.Tensor, rows: int, blocks: int, streams: int):
        self.positions = buffer[:rows]
        self.row_slots = buffer[rows : 2 * rows]
        self.blocks = buffer[2 * rows : 2 * rows + 2 * blocks].view(blocks, 2)
        self.meta = buffer[2 * rows + 2 * blocks :].view(4, streams + 1)
        self.num_blocks = blocks

    def bucket(self, rows: int, blocks: int) -> StaticLayout:
        view = object.__new__(StaticLayout)
        view.positions, view.row_slots = self.positions[:rows], self.row_slots[:rows]
        view.blocks, view.meta, view.num_blocks = self.blocks[:blocks], self.meta, blocks
        return view


class PaddedLayout:
    """A call's layout padded to a bucket of rows, in the static buffer: filled on the host, copied in one
    transfer."""

    def __init__(self, max_rows: int, max_streams: int, scratch: int, device: torch.device):
        self.max_rows, self.max_streams, self.scratch = max_rows, max_streams, scratch
        cuda = device.type == "cuda"
        blocks = self.blocks_for(max_rows)
        size = 2 * max_rows + 2 * blocks + 4 * (max_streams + 1)
        self.host = torch.zeros(size, dtype=torch.int32, pin_memory=cuda)
        self.device_buffer = torch.zeros(size, dtype=torch.int32, device=device)
        self.copied = torch.cuda.Event() if cuda else None  # the last copy out of `host` has run
        self.static = StaticLayout(self.device_buffer, max_rows, blocks, max_streams)
        self._host = StaticLayout(self.host, max_rows, blocks, max_streams)

    def blocks_for(self, rows: int) -> int:
        """The attention's programs a bucket of `rows` may need (each stream's rows in blocks of BLOCK_M)."""
        return rows // BLOCK_M + min(rows, self.max_streams)

    def bucket(self, rows: int) -> StaticLayout:
        return self.static.bucket(rows, self.blocks_for(rows))

    def fill(self, slots: list[int], rows: list[int], counts: list[int], past: list[int], bucket: int) -> StaticLayout:
        """The streams (as attention.Layout takes them), padded to `bucket` rows → the bucket's device views."""
        if self.copied is not None:
            self.copied.synchronize()  # (the previous call's copy may not have read the host buffer yet)
        h, S = self._host, self.max_streams
        positions = [p + i for p, t in zip(past, counts) for i in range(t)]
        row_slots = [s for s, t in zip(slots, counts) for _ in range(t)]
        pad = bucket - len(positions)
        h.positions[:bucket] = torch.tensor(positions + [0] * pad, dtype=torch.int32)
        h.row_slots[:bucket] = torch.tensor(row_slots + [self.scratch] * pad, dtype=torch.int32)
        blocks = [(i, start) for i, t in enumerate(counts) for start in range(0, t, BLOCK_M)]
        grid = self.blocks_for(bucket)
        h.blocks[:grid] = torch.tensor(blocks + [(S, 0)] * (grid - len(blocks)), dtype=torch.int32).view(grid, 2)
        h.meta.zero_()
        for j, column in enumerate((slots, rows, counts, past)):
            h.meta[j, : len(column)] = torch.tensor(column, dtype=torch.int32)
        self.device_buffer.copy_(self.host, non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        return self.bucket(bucket)


class LayerGraphs:
    def __init__(self, layers, pool: KVPool, max_streams: int, buckets: tuple[int, ...] = ROW_BUCKETS):
        """layers(x [N, dim], layout) → [N, dim]: the positions and the layers over `pool` (WhisperVQEncoder's).
        max_streams: the most streams a call holds (the worker's speakers per call)."""
        if pool.scratch is None:
            raise ValueError("the graphs' padding rows need the pool's scratch slot (KVPool(scratch=True))")
        self.layers, self.pool, self.max_streams, self.buckets = layers, pool, max_streams, buckets
        device, dim = pool.k.device, pool.k.shape[2] * pool.k.shape[4]
        self.layout = PaddedLayout(buckets[-1], max_streams, pool.scratch, device)
        self.x = torch.zeros(buckets[-1], dim, dtype=pool.k.dtype, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.replays = 0  # (tests, metrics)
        self._capture()

    @torch.inference_mode()
    def _capture(self) -> None:
        """Largest bucket first, one memory pool for all (a call replays one graph and reads its output before the
        next). The static buffers hold padding only while capturing: every write goes to the scratch slot."""
        self.layout.fill([], [], [], [], self.buckets[-1])
        torch.cuda.synchronize()
        pool = None
        for rows in reversed(self.buckets):
            layout = self.layout.bucket(rows)
            graph, out = capture(lambda: self.layers(self.x[:rows], layout), self.x.device, pool)
            pool = graph.pool()
            self.graphs[rows] = graph, out
        torch.cuda.synchronize()

    def fits(self, rows: int, streams: int) -> bool:
        return 0 < rows <= self.buckets[-1] and streams <= self.max_streams

    def run(self, x: torch.Tensor, slots: list[int], rows: list[int], counts: list[int], past: list[int]) -> torch.Tensor:
        """x [N, dim], streams laid out as attention.Layout's → the layers' output [N, dim] (a view of the graph's
        output: read it before the next call)."""
        n = x.shape[0]
        bucket = next(b for b in self.buckets if b >= n)
        self.layout.fill(slots, rows, counts, past, bucket)
        self.x[:n].copy_(x)
        graph, out = self.graphs[bucket]
        graph.replay()
        self.replays += 1
        return out[:n]
