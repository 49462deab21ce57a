"""The flow's calls as CUDA graphs: one graph per call shape, all in one memory pool, and the host-to-device copies
that feed them.

A flow call at the real size is ~6,000 kernels (the encoder and every Euler step); launched one by one from Python
they would take longer than the GPU takes to run them. So each shape a call can take, (B rows, T tokens, whether
it reads the prompt prefix, N frames solved per row for a stream-history call), is captured once
(`FlowTokenDecoder.shapes`, by the server; outside a server, a shape is captured at its first call)
and replayed: a call copies its inputs into the graph's static ones (`copy_into`) and replays it. The output mel
[B, 80, frames] is the graph's own tensor, overwritten by the next replay: callers copy out what they keep.

Once serving, a worker never captures a shape: a shape not captured yet is padded into a larger captured graph that
holds it (`pick`), or, with none, runs eagerly, unpadded (much slower). The server captures the largest graphs (the
covers, which hold every call) before serving, and the rest while serving with every worker idle
(services/vocoder/capture.py): a capture syncs the device and forbids CUDA calls from the process's other threads until
it ends. On an H200, with the streams past the stream history's 128 slots decoding over windows, a worker's capture
beside the other worker's calls failed the lane's event query, the capture with it, and the device-side assert that
followed restarted the vocoder, failing every stream (CUDA's thread-local capture mode did not save it: the capture's
own device sync fails beside another capture; docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch

from services.common.cuda_graph import capture
from services.vocoder.codec.encoder_state import EncoderRows
from services.vocoder.codec.flow import CausalMaskedDiffWithXvec, FlowBatch
from services.vocoder.codec.history import HistoryRows

log = logging.getLogger(__name__)


class FlowGraphs:
    """A decoder's graphs. Two threads never replay graphs of one pool at once: a second worker's decoder has its
    own (FlowTokenDecoder.lane)."""

    def __init__(self, flow: CausalMaskedDiffWithXvec, device: torch.device, dtype: torch.dtype, frames_per_token: int,
                 num_mels: int):
        self.flow, self.device, self.dtype = flow, device, dtype
        self.ratio, self.num_mels = frames_per_token, num_mels
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, FlowBatch, torch.Tensor]] = {}
        self.pool = None
        self.serving = False  # TokenVocoder.serve, after the server's warm-up: from then on `pick` captures nothing
        self.eager_shapes: set[tuple] = set()
        # Told of a call whose shape is not captured while serving, and whether a captured graph covers it → whether
        # its capture is planned (capture.py: then it comes next, at once if nothing covers it); None: no capture while
        # serving.
        self.on_missing: Callable[[tuple, bool], bool] | None = None

    def __len__(self) -> int:
        return len(self.graphs)

    def __iter__(self):
        """The shapes captured: (B, T, whether the call reads a prefix or history, N frames solved or None)."""
        return iter(self.graphs)

    def replay(self, batch: FlowBatch, B: int, T: int, prefix, solved: int | None = None,
               scratch: int | None = None) -> torch.Tensor:
        """A call of B rows of T tokens (batch: its inputs, on the device) → the graph's mel [B, 80, frames].
        prefix: the prompt prefix or the stream history the call reads (None: neither); solved: a history call's
        frames per row; scratch: the history's scratch slot (the capture's own run writes there)."""
        graph, static, out = self.capture(B, T, prefix, solved, scratch)
        copy_into(static, batch)
        graph.replay()
        return out

    def pick(self, B: int, T: int, reads: Callable[[int], bool], solved: int | None = None) -> tuple | None:
        """The graph a call of B rows of T tokens replays → its (B', T', N') (solved: a history call's frames per row,
        N' None for a window call); reads(B'): whether a call of that batch bucket reads a prefix or the history.
        Its own shape if captured, or not serving yet (then captured at its first call). Once serving, a shape not
        captured asks for its capture (on_missing) and the call is padded into the smallest captured graph that
        holds it (a cover: more rows, tokens or frames solved, which padding never reaches; the server captures one
        before serving: capture.py), or, with none, runs eagerly, unpadded (None; logged once a shape)."""
        key = (B, T, reads(B), solved)
        if key in self.graphs or not self.serving:
            return B, T, solved
        covers = [k for k in self.graphs if k[0] >= B and k[1] >= T and k[2] == reads(k[0])
                  and (k[3] is None) == (solved is None) and (solved is None or k[3] >= solved)]
        cover = min(covers, key=lambda k: (k[0], k[1], k[3] or 0), default=None)
        planned = self.on_missing is not None and self.on_missing(key, cover is not None)
        if cover is not None:
            return cover[0], cover[1], cover[3]
        if not planned and key not in self.eager_shapes:
            self.eager_shapes.add(key)
            log.warning("vocoder: flow calls of %d rows, %d tokens (%s, %s frames solved) run eagerly: their shape is "
                        "not captured", B, T,
                        "history" if solved is not None else "prefix" if key[2] else "no prefix", solved)
        return None

    def capture(self, B: int, T: int, prefix, solved: int | None = None, scratch: int | None = None):
        """The graph of a call's shape, captured at its first use (before serving) → (graph, static inputs, output)."""
        key = (B, T, prefix is not None, solved)
        if key not in self.graphs:
            static = self.empty(B, T, solved, scratch, kept_encoder=getattr(prefix, "encoder", None) is not None)
            graph, out = capture(lambda: self.flow(static, streaming=True, prefix=prefix), self.device, self.pool)
            self.pool = graph.pool()
            self.graphs[key] = (graph, static, out)
        return self.graphs[key]

    def empty(self, B: int, T: int, solved: int | None = None, scratch: int | None = None,
              kept_encoder: bool = False) -> FlowBatch:
        """A graph's static inputs; a history call's rows in the scratch slot (the solve's admissions too: solve.py);
        kept_encoder: its rows' encoder state kept (encoder_state.py)."""
        to = dict(device=self.device)

        def zeros(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, **to)

        batch = FlowBatch(zeros(B, T), torch.ones(B, dtype=torch.long, **to), zeros(B),
                          zeros(B, T * self.ratio, self.num_mels, dtype=self.dtype), zeros(B),
                          zeros(B, self.flow.cfg.spk_embed_dim, dtype=self.dtype), zeros(B), zeros(B))
        if solved:
            batch.solve_index, batch.solve_frames = zeros(B, solved), zeros(B)
            batch.history = HistoryRows(torch.full((B,), scratch, **to), zeros(B), zeros(B), torch.full((B,), -1, **to),
                                        zeros(B))
            if kept_encoder:
                batch.encoder_rows = EncoderRows(torch.full((B,), scratch, **to), zeros(B), zeros(B))
        return batch


def on_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A host tensor on the device without waiting for the work queued there: through pinned memory, not blocking (a
    pageable copy waits for its stream to finish everything queued before it; PyTorch's pinned blocks are not reused
    before their copy has run)."""
    if device.type != "cuda":
        return t.to(device=device, dtype=dtype)
    return t.to(dtype=dtype).pin_memory().to(device, non_blocking=True)


def copy_into(static: FlowBatch, batch: FlowBatch) -> None:
    """A call's inputs into a graph's static ones, field by field (history rows too)."""
    for field in dataclasses.fields(FlowBatch):
        src, dst = getattr(batch, field.name), getattr(static, field.name)
        if isinstance(src, torch.Tensor):
            dst.copy_(src)
        elif isinstance(src, (HistoryRows, EncoderRows)):
            for part in dataclasses.fields(src):
                getattr(dst, part.name).copy_(getattr(src, part.name))
