"""The flow's solve batched at the Euler step: rows join and leave a running solve, as requests join and leave an LLM
engine's batch at the token.

A flow call runs its rows through all 10 Euler steps together, so a stream's first block that comes in while a call
runs waits for that call to end, then for its own (at 128 streams on an H100: ~60 ms, then ~90 ms of a big call;
docs/codec.md). Here the solve is a table of rows in flight, each at its own step, and a `tick` is one estimator pass
over all of them (flow.py's solve_step: each row's time term, step size, and the prefix's and history's keys of its
step). A row admitted between two ticks takes part in the next one and leaves after its 10th, with the mel a whole
call would have given it (tests/test_codec_solve.py); the rows of playing streams, due later, keep the ticks full.

Rows are stream-history rows (history.py): a stream's new frames, read against its ring. A stream has at most one row
in flight: its next window reads, at each step, the frames this one writes at that step.

Table (capacity C rows, one more for padding): inputs [2·(C + 1), N, 4·80] (a row's CFG pair at r and C + 1 + r),
mask [C + 1, N, 1], lengths [2·(C + 1)], each row's voice, history places (history.HistoryRows), solved frames and
step; N: the most frames a history row solves (the decoder's solve_cap). On CUDA a tick is a CUDA graph per batch
bucket (SOLVE_BUCKETS): the rows' places go into its index buffer, padding places point at the table's last
row, whose history slot is the scratch one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass

import torch

from services.common.cuda_graph import capture
from services.vocoder.codec.decoder import BATCH_BUCKETS
from services.vocoder.codec.flow import flow_times
from services.vocoder.codec.flow_graphs import copy_into, on_device
from services.vocoder.codec.history import HistoryRows
from services.vocoder.runner import smallest

# Ticks queued on the device before the host waits for the oldest: the host prepares the next tick while the device
# runs this one, and admissions decide on the solve as it stands, not as it will be many ticks later.
TICKS_AHEAD = 2
# Rows of a tick or an admission, each a CUDA graph: the flow calls' buckets, then steps of 8 (a tick of 64 rows is
# ~2x one of 32: the estimator's matmuls are still small).
SOLVE_BUCKETS = BATCH_BUCKETS + (40, 48, 56, 64)


@dataclass
class Solving:
    """A row in flight: the caller's tag, its place in the table, its step, and which of its frames it returns
    (a stream's first call also solves the prompt's frames after the prefix: `skip` of them)."""

    tag: object
    place: int
    frames: int
    skip: int
    stream: int | None = None   # the decoder's stream id: its history slot is busy while the row flies
    step: int = 0


class FlowSolve:
    def __init__(self, decoder, capacity: int, ahead: int = TICKS_AHEAD):
        """decoder: a FlowTokenDecoder with a stream history (its flow, prefix, history and plans); capacity: rows in
        flight at most; ahead: ticks queued on the device before tick() waits for the oldest."""
        if decoder.history is None:
            raise ValueError("flow solve: the decoder keeps no stream history (set_voices with history streams)")
        if capacity < 1:
            raise ValueError(f"flow solve: capacity must be >= 1, got {capacity}")
        self.decoder, self.capacity = decoder, capacity
        self.solver = decoder.flow.decoder
        self.steps = self.solver.n_timesteps
        self.N = max(decoder.solve_buckets)
        rows, dev = capacity + 1, decoder.device
        channels = self.solver.estimator.cfg.in_channels
        self.inputs = torch.zeros(2 * rows, self.N, channels, dtype=decoder.dtype, device=dev)
        self.mask = torch.zeros(rows, self.N, 1, dtype=decoder.dtype, device=dev)
        self.lengths = torch.zeros(2 * rows, dtype=torch.int32, device=dev)
        self.voice = torch.zeros(rows, dtype=torch.long, device=dev)
        self.solved = torch.zeros(rows, dtype=torch.long, device=dev)
        self.step = torch.zeros(rows, dtype=torch.long, device=dev)
        self.places = HistoryRows(*(torch.zeros(rows, dtype=torch.long, device=dev) for _ in range(5)))
        self.scratch = capacity                    # the padding place: the history's scratch slot, no frames
        self.places.slot[self.scratch], self.places.bank[self.scratch] = decoder.history.scratch, -1
        self.free = list(range(capacity - 1, -1, -1))
        self.flight: list[Solving] = []
        # every step's time terms [S, R, C], made once: they depend on the weights alone (loaded before a solve)
        self.terms = self.solver.estimator.time_terms(flow_times(self.steps, decoder.dtype, dev))
        self.use_graphs = decoder.use_graphs
        self.graphs: dict = {}            # batch bucket → a tick's graph; ("admit", B, T) → an admission's
        self.pool = None
        self.ahead = ahead
        self.queued: list = []            # the end events of ticks queued on the device (CUDA)
        self.timed: list = []             # (kind, rows, start, end): perf_counter seconds, or CUDA events

    @property
    def room(self) -> int:
        return len(self.free)

    @torch.inference_mode()
    def admit(self, rows: list, tags: list) -> None:
        """History rows [(FlowState, Plan)] (the decoder's capped plans, states assigned a slot) join the solve at
        the next tick; each comes back from tick() with its tag once solved. Rows admitted together run the encoder
        in one batch: on CUDA a graph per (batch bucket, token bucket), its padding rows written to the scratch
        place."""
        if len(rows) > self.room:
            raise ValueError(f"flow solve: {len(rows)} rows admitted, room for {self.room}")
        if any(state.stream is None or state.slot is None or state.slot < 0 for state, _ in rows):
            raise ValueError("flow solve: only stream-history rows are solved here (a stream started by the decoder, "
                             "holding a slot); others are decoded over their window (decode_chunks)")
        d = self.decoder
        spans = [d._solved(s, p) for s, p in rows]
        longest = max(d.history_row_tokens(s, p) for s, p in rows)
        B, T = smallest(SOLVE_BUCKETS, len(rows)), smallest(d.history_token_buckets, longest)
        graph = self.use_graphs and B is not None and T is not None
        B, T = (B, T) if graph else (len(rows), longest)
        batch = d.history_batch(rows, B, T, self.N)
        places = [self.free.pop() for _ in rows]     # (after the batch: a row that fails there takes no place)
        at = places + [self.scratch] * (B - len(rows))
        with self._timing("admit", len(rows)):
            if graph:
                cuda_graph, static, static_at = self._admission_graph(B, T)
                copy_into(static, batch)
                static_at.copy_(on_device(torch.tensor(at), static_at.device))
                cuda_graph.replay()
            else:
                self._admit(batch, on_device(torch.tensor(at), self.inputs.device))
        streams = [state.stream for state, _ in rows]
        d.history.begin(streams)                   # a slot let go meanwhile (a cancel) is freed once its row is out
        for tag, place, (a, b, skip), stream in zip(tags, places, spans, streams):
            self.flight.append(Solving(tag, place, b - a, skip, stream))

    def _admit(self, batch, at: torch.Tensor) -> None:
        """The encoder and the solver's inputs of batch's rows, into the table at places `at` [B] (a padding row's,
        the scratch place: its own fields, a scratch history slot and no frames, are what it writes there)."""
        d = self.decoder
        mu, mask, spks, cond, noise_index, _ = d.flow.prepare(batch, True, d.history)
        inputs, lengths = self.solver.start(mu, mask, spks, cond, noise_index)
        both = torch.cat([at, at + self.capacity + 1])
        self.inputs[both], self.lengths[both], self.mask[at] = inputs, lengths, mask
        self.voice[at], self.solved[at] = batch.voice_index, batch.solve_frames
        self.step.index_fill_(0, at, 0)
        for field in dataclasses.fields(HistoryRows):
            getattr(self.places, field.name)[at] = getattr(batch.history, field.name)

    def _admission_graph(self, B: int, T: int):
        """The admission of B rows of T tokens as a CUDA graph → (graph, its static batch, its places buffer)."""
        key = ("admit", B, T)
        if key not in self.graphs:
            static = self.decoder.graphs.empty(B, T, self.N, self.decoder.history.scratch)
            at = torch.full((B,), self.scratch, dtype=torch.long, device=self.inputs.device)
            graph, _ = capture(lambda: self._admit(static, at), self.inputs.device, self.pool)
            self.pool = graph.pool()
            self.graphs[key] = (graph, static, at)
        return self.graphs[key]

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Capture every graph a tick or an admission can need (batch buckets up to the capacity; the history's token
        buckets), before serving."""
        if not self.use_graphs:
            return
        for B in (b for b in SOLVE_BUCKETS if b <= (smallest(SOLVE_BUCKETS, self.capacity) or SOLVE_BUCKETS[-1])):
            self._graph(B)
            for T in self.decoder.history_token_buckets:
                self._admission_graph(B, T)

    @torch.inference_mode()
    def tick(self) -> list[tuple[object, torch.Tensor]]:
        """One Euler step of every row in flight → the rows it finished: [(tag, mel [80, n] float32)]."""
        if not self.flight:
            return []
        places = [r.place for r in self.flight]
        bucket = smallest(SOLVE_BUCKETS, len(places)) if self.use_graphs else None
        with self._timing("tick", len(places)) as end:
            if bucket is None:
                self._pass(on_device(torch.tensor(places), self.inputs.device))
            else:
                graph, at = self._graph(bucket)
                at.copy_(on_device(torch.tensor(places + [self.scratch] * (bucket - len(places))), at.device))
                graph.replay()
        if end is not None:                          # at most `ahead` ticks queued: wait for the oldest
            self.queued.append(end)
            while len(self.queued) > self.ahead:
                self.queued.pop(0).synchronize()
        done, left, flying = [], [], []
        for r in self.flight:
            r.step += 1
            if r.step < self.steps:
                flying.append(r)
                continue
            mel = self.inputs[r.place, r.skip : r.frames, : self.decoder.cfg.num_mels]    # x: the mel, solved
            done.append((r.tag, mel.t().float().clone()))
            left.append(r)
        self.flight = flying
        self._leave(left)
        return done

    @contextlib.contextmanager
    def _timing(self, kind: str, rows: int):
        """Times the work queued inside (CUDA: events, read once the device has run it) → yields the end event
        (None on the CPU)."""
        if not self.inputs.is_cuda:
            started = time.perf_counter()
            yield None
            self.timed.append((kind, rows, started, time.perf_counter()))
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield end
        end.record()
        self.timed.append((kind, rows, start, end))

    def times(self) -> list[tuple[str, int, float]]:
        """(kind: "admit" or "tick", rows, seconds) of the admissions and ticks whose time is known (on CUDA: the
        device has run them; device time), each once."""
        out, left = [], []
        for kind, rows, start, end in self.timed:
            if isinstance(end, float):
                out.append((kind, rows, end - start))
            elif end.query():
                out.append((kind, rows, start.elapsed_time(end) / 1000))
            else:
                left.append((kind, rows, start, end))
        self.timed = left
        return out

    def drop(self, tag) -> bool:
        """The row of `tag` leaves the solve unsolved (its stream was cancelled) → whether it was in flight. Its place
        is free for the next admission; its stream's history slot, if let go, is freed once the device is past it."""
        row = next((r for r in self.flight if r.tag == tag), None)
        if row is None:
            return False
        self.flight.remove(row)
        self._leave([row])
        return True

    def _leave(self, rows: list[Solving]) -> None:
        """Rows out of the solve: their places free, their streams' slots no longer written by it (history.end, with
        an event the device's work so far completes with)."""
        if not rows:
            return
        self.free.extend(r.place for r in rows)
        done = None
        if self.inputs.is_cuda:
            done = torch.cuda.Event()
            done.record()
        self.decoder.history.end([r.stream for r in rows], done)

    def _pass(self, at: torch.Tensor) -> None:
        """One estimator pass and Euler step of the rows at places `at` [B] (the scratch place for padding)."""
        both = torch.cat([at, at + self.capacity + 1])
        part = self.inputs[both]
        places = HistoryRows(*(getattr(self.places, f.name)[at] for f in dataclasses.fields(HistoryRows)))
        view = self.decoder.history.view(self.voice[at], places, self.solved[at])
        self.solver.solve_step(part, self.mask[at], self.lengths[both], self.step[at], True, view, self.terms)
        self.inputs[both] = part
        self.step[at] += 1
        self.step[self.scratch :].zero_()            # padding stays at step 0 (a kernel: no host copy in a graph)

    def _graph(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The tick of `bucket` rows as a CUDA graph, and its index buffer."""
        if bucket not in self.graphs:
            at = torch.full((bucket,), self.scratch, dtype=torch.long, device=self.inputs.device)
            graph, _ = capture(lambda: self._pass(at), self.inputs.device, self.pool)
            self.pool = graph.pool()
            self.graphs[bucket] = (graph, at)
        return self.graphs[bucket]
