"""The vocoder's CUDA graphs, captured in two parts, so that it serves seconds after it starts.

At the real size the vocoder has ~220 graphs: the generator's per (batch bucket, frames bucket) and the flow's per
(batch bucket, token bucket, frames solved), for each worker lane (runner.py, codec/flow_graphs.py). Captured
all before serving they took 63-88 s on an H200, and a vocoder restarted after a crash answered nothing
meanwhile (docs/benchmarks.md). So:
- **before serving**, the covers: each kind's largest graph (`GraphShape.cover`: the most rows, tokens and frames a
  call can have), into which a call of a shape not captured yet is padded, so that every call replays a graph from the
  first (`--graphs-before-serving first` adds the graphs of calls of one window, batch bucket 1: all that one stream's
  turn reaches; they come first while serving otherwise);
- **while serving**, the rest, by a thread of its own, one graph at a time, smallest batch first (the order a growing
  load reaches them in), only while the vocoder is idle: no call running and none waiting, for `IDLE_SECONDS`. A graph
  some call has needed comes first. A call that comes during a capture waits for it (one graph: `capture_seconds` in
  the log line below).

Why never beside a call: a capture forbids every other thread's CUDA work until it ends (CUDA's global capture mode),
and beside a worker's calls a capture failed and took the vocoder down (flow_graphs.py). `DeviceGate` keeps the
workers' calls and the captures apart. Until its shape is captured, a call is padded into its kind's cover; with no
cover captured it runs eagerly, unpadded, as a shape that no plan holds does: correct, and much slower at the real size
(a flow call is ~6,000 kernels launched one by one, ~0.3 s on an H200 against ~30 ms replayed). Why covers: a vocoder
restarted under load ran every call of the shapes not yet captured eagerly, and captured nothing, since it was never
idle; its turns' first audio took seconds (docs/benchmarks.md). Capturing each needed graph at once, holding the calls
(~0.6 s for a flow graph), still left the load's first audio 15-19 s late and its streams stalling seconds after the
vocoder was back (2026-11-29). A cover costs one graph of each kind before serving (~0.7 s for a flow graph), and a
call padded into it runs as a full call does (63.7 ms for 32 streams' flow against 43.2 ms for 16's on an H200): slower
than its own graph and far faster than eagerly, and never waiting on a capture. So a needed graph with a cover waits
for the vocoder to be idle, as the rest do, just first among them. Only a call with no cover (none captured) has its
graph captured as soon as the calls running end (new calls wait for it), since one capture costs less than a single
eager call more.
`vocoder_graphs_pending` counts the graphs still to capture, and the log says when the last is captured: benchmarks
that follow a start wait for that line.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

log = logging.getLogger(__name__)

IDLE_SECONDS = 0.05  # how long the vocoder is idle before a capture while serving begins
FIRST_BATCH = 1      # graphs of calls of up to this many windows: before serving with --graphs-before-serving first


class GraphShape(NamedTuple):
    """A graph to capture: its batch bucket (the order they are captured in), the call that captures it, its key
    (id of its owner, the owner's key of the shape: what the owner's on_missing names it by), and whether it is a
    cover (the largest of its kind, into which the calls of its kind not captured yet are padded)."""

    batch: int
    capture: Callable[[], object]
    key: tuple | None = None
    cover: bool = False


class DeviceGate:
    """The workers' calls and the captures made while serving, never at once."""

    def __init__(self):
        self.cv = threading.Condition()
        self.calls = 0             # workers' calls running
        self.capturing = False
        self.held = False          # a capture is waiting for the calls running: new ones wait
        self.quiet_since = time.monotonic()
        self.queues: list = []     # the workers (their `pending` jobs): watched so that a capture waits for them

    def watch(self, worker) -> None:
        self.queues.append(worker)

    def busy(self) -> bool:
        return self.calls > 0 or any(q.pending for q in self.queues)

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """A worker's use of the device (a call, a device probe): waits for a capture under way."""
        with self.cv:
            while self.capturing or self.held:
                self.cv.wait()
            self.calls += 1
        try:
            yield
        finally:
            with self.cv:
                self.calls -= 1
                self.quiet_since = time.monotonic()
                self.cv.notify_all()

    @contextlib.contextmanager
    def alone(self, idle_seconds: float = IDLE_SECONDS, stop: threading.Event | None = None,
              urgent: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """Wait until the device has been idle for idle_seconds (no call running, no job waiting), or while urgent()
        only until the calls running end (new calls wait meanwhile), then keep calls out until the block ends; one
        holder at a time. Yields False (and keeps nothing out) if stop is set first. (urgent() is read holding the
        gate's lock.)"""
        mine = False
        with self.cv:
            while not (stop is not None and stop.is_set()):
                if self.capturing:  # another holder (a capture, a voice being added): one at a time
                    self.cv.wait(0.01)
                elif urgent():
                    self.held = True
                    if self.calls == 0:
                        mine = True
                        break
                    self.cv.wait(0.01)
                elif self.busy():  # (a job handed in wakes no one here: look again soon)
                    self.quiet_since = time.monotonic()
                    self.cv.wait(max(idle_seconds, 0.005))
                elif (left := self.quiet_since + idle_seconds - time.monotonic()) > 0:
                    self.cv.wait(left)
                else:
                    mine = True
                    break
            self.capturing |= mine
            self.held = False
            if not mine:
                self.cv.notify_all()
        if not mine:
            yield False
            return
        try:
            yield True
        finally:
            with self.cv:
                self.capturing = False
                self.quiet_since = time.monotonic()
                self.cv.notify_all()


def exclusive(gate: DeviceGate | None):
    """The device to this thread alone while the block runs, as soon as the calls running end (new calls wait): for
    work beside which a call must not run (a voice's prefix recorded into tensors the calls' graphs read). No gate:
    nothing to wait for."""
    return gate.alone(0.0, urgent=lambda: True) if gate is not None else contextlib.nullcontext(True)


def split(shapes: list[GraphShape], first_calls: bool = False) -> tuple[list[GraphShape], list[GraphShape]]:
    """→ (the graphs to capture before serving: the covers, and with first_calls those of one window's calls; the rest
    in the order to capture them while serving)."""
    before = [s.cover or (first_calls and s.batch <= FIRST_BATCH) for s in shapes]
    first = [s for s, b in zip(shapes, before) if b]
    rest = sorted((s for s, b in zip(shapes, before) if not b), key=lambda s: s.batch)  # (stable: plan order)
    return first, rest


class BackgroundCapture:
    """Captures `shapes` one at a time while serving (module docstring): one that a call needed (`demand`) as soon as
    the calls running end, the others in order when the gate finds the vocoder idle. run_capture(shape) runs one on
    this thread (the server's: with the device current and inference mode on)."""

    def __init__(self, shapes: list[GraphShape], gate: DeviceGate, run_capture: Callable[[GraphShape], None],
                 idle_seconds: float = IDLE_SECONDS):
        self.queue, self.gate, self.run_capture, self.idle_seconds = list(shapes), gate, run_capture, idle_seconds
        self.total = len(self.queue)
        self.needed: list[GraphShape] = []  # demanded by a call, in the order they were (under gate.cv)
        self.captured = 0
        self.demanded: set[tuple] = set()  # the keys calls needed
        self.failed: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="vocoder-capture", daemon=True)

    @property
    def pending(self) -> int:
        """Graphs still to capture (0 once a capture failed: the rest run eagerly)."""
        return 0 if self.failed is not None else self.total - self.captured

    def watch(self, owner) -> None:
        """owner (a GeneratorRunner or FlowGraphs) tells this capture of the calls whose graph it lacks (on_missing)."""
        owner.on_missing = lambda key, covered=False, o=id(owner): self.demand((o, key), covered)

    def demand(self, key: tuple, covered: bool = False) -> bool:
        """A call needed the graph of this key → whether its capture is planned. Covered (the call was padded into a
        cover): it comes first among those captured while idle; else (the call runs eagerly) next, as soon as the
        calls running end. From a worker's thread."""
        with self.gate.cv:
            if self.failed is not None or self.stopping.is_set():
                return False
            if any(s.key == key for s in self.needed):
                return True
            for i, shape in enumerate(self.queue):
                if shape.key == key:
                    self.demanded.add(key)
                    if covered:
                        self.queue.insert(0, self.queue.pop(i))
                    else:
                        self.needed.append(self.queue.pop(i))
                        self.gate.cv.notify_all()
                    return True
        return False

    def start(self) -> BackgroundCapture:
        if self.queue:
            self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        with self.gate.cv:
            self.gate.cv.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    def _next(self) -> GraphShape | None:
        """(Under gate.cv) the graph to capture now: a needed one first."""
        if self.needed:
            return self.needed.pop(0)
        return self.queue.pop(0) if self.queue else None

    def _loop(self) -> None:
        started, busy = time.perf_counter(), 0.0
        while self.queue or self.needed:
            with self.gate.alone(self.idle_seconds, self.stopping, urgent=lambda: bool(self.needed)) as alone:
                if not alone:
                    return
                with self.gate.cv:
                    shape = self._next()
                if shape is None:
                    continue
                began = time.perf_counter()
                try:
                    self.run_capture(shape)
                except Exception as exc:  # noqa: BLE001  a capture's failure leaves its shape (and the rest) eager
                    with self.gate.cv:
                        self.failed = exc
                    log.exception("vocoder: capturing a CUDA graph while serving failed; the %d graphs left run "
                                  "eagerly", self.total - self.captured)
                    return
                busy += time.perf_counter() - began
                self.captured += 1
        log.info("vocoder: every CUDA graph captured: the last %d while serving, in %.1f s (%.1f s of captures, "
                 "capture_seconds %.2f on average; %d of them needed by a call first)", self.captured,
                 time.perf_counter() - started, busy, busy / max(self.captured, 1), len(self.demanded))
