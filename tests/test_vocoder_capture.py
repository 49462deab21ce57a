"""The vocoder's graphs captured in two parts (services/vocoder/capture.py): what is captured before serving, the
order of the rest, and that a capture while serving never overlaps a worker's call. The captures here are stand-ins
that take time (a CPU has no CUDA graphs); the workers are real, on the tiny vocoder."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import numpy as np
import pytest
import torch
from lanes import run_streams

from services.vocoder.capture import BackgroundCapture, DeviceGate, GraphShape, split
from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.streamer import MelStreamer
from services.vocoder.worker import Job, VocoderWorker


class Timeline:
    """Intervals of work on the 'device', by kind, from several threads."""

    def __init__(self):
        self.lock, self.spans = threading.Lock(), []

    def span(self, kind: str, seconds: float) -> None:
        began = time.perf_counter()
        time.sleep(seconds)
        with self.lock:
            self.spans.append((kind, began, time.perf_counter()))

    def overlaps(self, a: str, b: str) -> list[tuple]:
        xs = [s for s in self.spans if s[0] == a]
        ys = [s for s in self.spans if s[0] == b]
        return [(x, y) for x in xs for y in ys if x[1] < y[2] and y[1] < x[2]]


class Timed:
    """A TokenVocoder whose calls take `seconds` on the timeline first."""

    def __init__(self, vocoder, timeline: Timeline, seconds: float = 0.004):
        self.vocoder, self.timeline, self.seconds = vocoder, timeline, seconds

    def __getattr__(self, name):
        return getattr(self.vocoder, name)

    def launch(self, windows, last, conditions=None):
        self.timeline.span("call", self.seconds)
        return self.vocoder.launch(windows, last, conditions)


@pytest.fixture(scope="module")
def vocoder():
    return load_vocoder(None, "tiny")


def shape(batch: int, timeline: Timeline, seconds: float = 0.02, log: list | None = None) -> GraphShape:
    def capture():
        timeline.span("capture", seconds)
        if log is not None:
            log.append(batch)
    return GraphShape(batch, capture)


def test_split_keeps_the_covers_and_one_windows_calls_if_asked_first_and_orders_the_rest_by_batch():
    t = Timeline()
    shapes = [shape(b, t) for b in (1, 4, 2, 1, 32, 2)]
    shapes[4] = shapes[4]._replace(cover=True)
    first, rest = split(shapes)
    assert [s.batch for s in first] == [32]
    assert [s.batch for s in rest] == [1, 1, 2, 2, 4]     # one window's calls first while serving
    assert rest[2] is shapes[2] and rest[3] is shapes[5]  # (a batch's graphs stay in plan order)
    first, rest = split(shapes, first_calls=True)         # --graphs-before-serving first
    assert [s.batch for s in first] == [1, 1, 32]
    assert [s.batch for s in rest] == [2, 2, 4]


def test_a_covered_call_moves_its_graph_first_among_those_captured_while_idle():
    """demand(covered=True): the call was padded into a cover, so its graph waits for the vocoder to be idle as the
    others do, first among them; a busy vocoder captures nothing, and a later uncovered demand still comes at once."""
    t = Timeline()
    gate = DeviceGate()

    class Queue:
        pending = [object()]  # a job always waiting: never idle

    gate.watch(Queue())
    shapes = [GraphShape(b, lambda b=b: t.span("capture", 0.03), ("owner", b)) for b in (2, 3, 4, 6)]
    with busy_worker(gate, t):
        background = BackgroundCapture(shapes, gate, lambda s: s.capture(), idle_seconds=0.01).start()
        try:
            assert background.demand(("owner", 4), covered=True) and background.demand(("owner", 4), covered=True)
            assert [s.batch for s in background.queue] == [4, 2, 3, 6] and not background.needed
            time.sleep(0.15)
            assert background.captured == 0                        # covered: not worth holding the calls
            assert background.demand(("owner", 6))                 # not covered: next, between two calls
            deadline = time.monotonic() + 2
            while background.captured < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.1)
            assert background.captured == 1 and [s.batch for s in background.queue] == [4, 2, 3]
            assert background.demanded == {("owner", 4), ("owner", 6)}
            assert t.overlaps("capture", "call") == []
        finally:
            background.stop()


def test_captures_wait_for_an_idle_vocoder_and_calls_wait_for_a_capture(vocoder, caplog):
    """Streams keep the worker busy while eight captures are due: no capture overlaps a call, the captures come in
    batch order, and once the streams stop every capture is made and the log says so."""
    timeline, order = Timeline(), []
    gate = DeviceGate()
    worker = VocoderWorker(Timed(vocoder, timeline), max_batch=4, max_wait=0.0, gate=gate)
    background = BackgroundCapture([shape(b, timeline, log=order) for b in (2, 2, 3, 4, 6, 8, 12, 16)], gate,
                                   lambda s: s.capture(), idle_seconds=0.01)
    rng = np.random.default_rng(0)
    try:
        with caplog.at_level(logging.INFO, logger="services.vocoder.capture"):
            background.start()
            streamers = [MelStreamer(vocoder) for _ in range(4)]
            for round_ in range(15):  # chunks handed in back to back, and every third round a gap
                futures = [worker.submit(Job(s, rng.integers(0, 1024, 3).tolist(), None, 0.0)) for s in streamers]
                for f in futures:
                    f.result(timeout=10)
                time.sleep(0.05 if round_ % 3 == 2 else 0.0)
            background.thread.join(timeout=10)
        assert not background.thread.is_alive() and background.pending == 0 and background.failed is None
        assert order == [2, 2, 3, 4, 6, 8, 12, 16]
        calls = [s for s in timeline.spans if s[0] == "call"]
        captures = [s for s in timeline.spans if s[0] == "capture"]
        assert len(calls) >= 5 and any(c[1] > captures[0][2] and c[2] < captures[-1][1] for c in calls)  # interleaved
        assert timeline.overlaps("capture", "call") == []
        assert any("every CUDA graph captured: the last 8 while serving" in r.getMessage() for r in caplog.records)
    finally:
        background.stop()
        worker.stop()


def test_a_busy_vocoder_defers_every_capture_and_stop_ends_the_wait():
    class Queue:
        pending = [object()]  # a job always waiting

    gate = DeviceGate()
    gate.watch(Queue())
    t = Timeline()
    background = BackgroundCapture([shape(2, t), shape(4, t)], gate, lambda s: s.capture(), idle_seconds=0.01).start()
    time.sleep(0.2)
    assert background.pending == 2 and t.spans == []
    began = time.perf_counter()
    background.stop()
    assert not background.thread.is_alive() and time.perf_counter() - began < 1.0
    with gate.call():  # the gate is left open
        pass


def test_a_graph_a_call_needed_is_captured_between_calls_while_the_rest_wait_for_idle():
    """A worker busy without a pause: the graphs nobody asked for wait; the one a call asked for (demand) is captured
    as soon as the call running ends, the worker's next call held meanwhile, never beside a call."""
    t = Timeline()
    gate = DeviceGate()

    class Queue:
        pending = [object()]  # a job always waiting: never idle

    gate.watch(Queue())
    shapes = [GraphShape(b, lambda b=b: t.span("capture", 0.03), ("owner", b)) for b in (2, 3, 4)]
    with busy_worker(gate, t):
        background = BackgroundCapture(shapes, gate, lambda s: s.capture(), idle_seconds=0.01).start()
        try:
            time.sleep(0.1)
            assert background.captured == 0
            assert background.demand(("owner", 4)) and background.demand(("owner", 4))  # (twice: planned once)
            assert not background.demand(("owner", 99))                                 # not in the plan
            deadline = time.monotonic() + 2
            while background.captured < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.1)
            assert background.captured == 1 and background.demanded == {("owner", 4)}
            assert [s.batch for s in background.queue] == [2, 3]
            assert timeline_calls_after(t, "capture") > 0  # the worker went on
            assert t.overlaps("capture", "call") == []
        finally:
            background.stop()


@contextlib.contextmanager
def busy_worker(gate: DeviceGate, t: Timeline):
    """A worker thread whose calls (10 ms each, through the gate) follow one another without a pause while the block
    runs."""
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            with gate.call():
                t.span("call", 0.01)

    busy = threading.Thread(target=worker)
    busy.start()
    try:
        yield
    finally:
        stop.set()
        busy.join()


def timeline_calls_after(t: Timeline, kind: str) -> int:
    end = max(s[2] for s in t.spans if s[0] == kind)
    return sum(1 for s in t.spans if s[0] == "call" and s[1] >= end)


def test_a_generator_call_of_a_shape_not_captured_asks_for_its_graph(vocoder):
    """The runner, serving, meets a (batch, frames) it has no graph of: it runs the call eagerly and asks the
    background capture for that graph (on_missing), which moves it first."""
    from services.vocoder.runner import GeneratorRunner

    runner = GeneratorRunner(vocoder.generator, vocoder.hop_size, vocoder.device, graphs=True)
    gate = DeviceGate()
    planned = runner.shapes([1, 2])
    background = BackgroundCapture(planned, gate, lambda s: None)  # (not started: the queue stays as it is)
    background.watch(runner)
    runner.serving = True
    mels = [torch.randn(runner.num_mels, 14) for _ in range(2)]
    samples = runner(mels)
    assert [len(x) for x in samples] == [14 * vocoder.hop_size] * 2                # eager, on the CPU
    assert [s.key for s in background.needed] == [(id(runner), (2, 16))]           # batch bucket 2, frames bucket 16
    assert (2, 16) not in runner.eager_shapes                                      # planned: not logged as eager


def test_a_generator_call_of_a_shape_not_captured_is_padded_into_its_cover(vocoder):
    """Serving, with a graph of more rows captured for the call's frames (its cover): the call replays it, padded,
    gives the eager samples, and asks for its own graph as covered (captured when the vocoder is idle)."""
    from services.vocoder.runner import GeneratorRunner

    runner = GeneratorRunner(vocoder.generator, vocoder.hop_size, vocoder.device, graphs=True)
    static_in = [runner._input(4, 16)]
    static_out = runner.generator(*static_in).clone()

    class StandIn:  # replays as a graph captured over static_in would
        replays = 0

        def replay(self):
            static_out.copy_(runner.generator(*static_in))
            StandIn.replays += 1

    runner.graphs[(4, 16)] = (StandIn(), static_in, static_out)
    asked = []
    runner.on_missing = lambda key, covered: asked.append((key, covered)) or True
    runner.serving = True
    mels = [torch.randn(runner.num_mels, 14) for _ in range(2)]
    eager = GeneratorRunner(vocoder.generator, vocoder.hop_size, vocoder.device, graphs=False)
    for got, want in zip(runner(mels), eager(mels)):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    assert StandIn.replays == 1 and asked == [((2, 16), True)] and not runner.eager_shapes


def test_a_failed_capture_leaves_the_rest_eager_and_the_gate_open(caplog):
    t = Timeline()

    def broken():
        raise RuntimeError("capture failed")

    gate = DeviceGate()
    background = BackgroundCapture([shape(2, t), GraphShape(3, broken), shape(4, t)], gate, lambda s: s.capture(),
                                   idle_seconds=0.0)
    with caplog.at_level(logging.ERROR, logger="services.vocoder.capture"):
        background.start().thread.join(timeout=5)
    assert background.captured == 1 and background.pending == 0 and isinstance(background.failed, RuntimeError)
    assert any("the 2 graphs left run eagerly" in r.getMessage() for r in caplog.records)
    assert not gate.capturing
    with gate.call():
        pass


def test_the_generators_plan_lists_each_graph_once_and_registers_the_last_windows(vocoder):
    """runner.shapes: every (batch bucket, frames bucket) of the batches and each exact length in its batches, once;
    the exact lengths run in graphs from the plan on; a captured graph is not planned again."""
    runner = vocoder.runner
    captured = []
    use, graph = runner.use_graphs, runner._graph
    runner.use_graphs, runner._graph = True, lambda b, f: captured.append((b, f))
    try:
        shapes = runner.shapes([1, 2], exact_frames=[30, 31], exact_batches=[1])
        assert len(shapes) == 2 * len(runner.frame_buckets) + 2
        # the covers: each length's most rows (the frames buckets' batch 2, the exact lengths' batch 1)
        assert sorted(s.key[1] for s in shapes if s.cover) == sorted([(2, f) for f in runner.frame_buckets] + [(1, 30), (1, 31)])
        assert runner.exact_frames >= {30, 31} and runner.exact_batch >= 1
        for s in shapes:
            s.capture()
        assert sorted(captured) == sorted({(b, f) for b in (1, 2) for f in runner.frame_buckets} | {(1, 30), (1, 31)})
        runner.graphs[(1, 30)] = None  # captured: left out of the next plan
        assert len(runner.shapes([1], exact_frames=[30])) == len(runner.frame_buckets)
    finally:
        runner.use_graphs, runner._graph = use, graph
        runner.graphs.pop((1, 30), None)
        runner.exact_frames.clear()
        runner.exact_batch = 0


def test_the_flows_plan_covers_every_call_and_the_lane_only_first_calls():
    """decoder.shapes: with the stream history, its two token buckets and two frame buckets for every batch bucket up
    to the call's limit; a first-chunk lane's plan is the first calls' alone. Batch bucket 1 is in both (split)."""
    codec = load_vocoder(None, "tiny-codec")
    decoder = codec.decoder
    assert decoder.history is not None
    captured = []
    decoder.use_graphs = True
    decoder.graphs.capture = lambda B, T, prefix, N=None, scratch=None: captured.append((B, T, N))
    voices = list(codec.voices.values())
    shapes = decoder.shapes(voices, max_batch=8)
    for s in shapes:
        s.capture()
    batches = [b for b in (1, 2, 3, 4, 6, 8)]
    assert sorted(captured) == sorted((B, T, N) for B in batches for T in decoder.history_token_buckets
                                      for N in decoder.solve_buckets)
    captured.clear()
    for s in decoder.shapes(voices, max_batch=4, first_calls=True):
        s.capture()
    assert sorted(captured) == [(B, decoder.history_token_buckets[0], decoder.solve_buckets[0]) for B in (1, 2, 3, 4)]
    (cover,) = [s for s in shapes if s.cover]
    assert cover.key[1] == (8, decoder.history_token_buckets[-1], True, decoder.solve_buckets[-1])  # holds every call
    assert split(shapes)[0] == [cover]
    first, _ = split(shapes, first_calls=True)
    assert [s for s in first if s.batch != 1] == [cover]
    assert len(first) == len(decoder.history_token_buckets) * len(decoder.solve_buckets) + 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs captured while serving: needs a GPU")
def test_graphs_captured_while_two_lanes_serve_give_each_stream_its_samples():
    """On CUDA, the server's plan (graph_shapes): the covers before serving, the rest captured
    by the background thread between the two lanes' calls (some calls padded into the covers, then their own graphs):
    no capture fails, every graph of the plan is captured, and each stream's samples are its samples alone with every
    graph captured first."""
    from services.vocoder.server import capture_while_serving, graph_shapes
    from services.vocoder.streamer import DEFAULT_LOOKAHEAD
    from services.vocoder.worker import FIRST_CHUNK_LANE_BATCH, Lanes

    def served(v, background: bool):
        lane = v.lane()
        shapes = graph_shapes(v, lane, [1, 2, 3, 4], 4, v.receptive_field[0], DEFAULT_LOOKAHEAD)
        first, rest = split(shapes) if background else (shapes, [])
        with torch.inference_mode():
            for s in first:
                s.capture()
        v.serve()
        lane.serve()
        gate = DeviceGate()
        lanes = Lanes(VocoderWorker(v, 4, max_wait=0.01, gate=gate),
                      VocoderWorker(lane, FIRST_CHUNK_LANE_BATCH, max_wait=0.01, first_chunk_budget=0, gate=gate,
                                    name="vocoder-first-chunks"))
        capture = capture_while_serving(rest, gate, [v, lane], idle_seconds=0.0)
        return lanes, capture, len(shapes)

    inputs = [(np.random.default_rng(n).integers(0, 1024, n).tolist(), schedule)
              for n, schedule in ((33, [8, 8, 17]), (28, [8, 20]), (30, [9, 6, 15]), (12, [12]))]
    results = []
    for background in (False, True):
        v = load_vocoder(None, "tiny-codec", device="cuda", flow=FlowOptions(history_streams=8))
        lanes, capture, planned = served(v, background)
        try:
            results.append(run_streams(lanes, v, inputs, pause=0.05))  # (room for a capture between rounds)
            if capture.thread.is_alive():
                capture.thread.join(timeout=120)
            assert capture.failed is None and capture.pending == 0
            assert captured(v, lanes) == planned
        finally:
            capture.stop()
            lanes.stop()
    for got, want in zip(*results):
        assert got.shape == want.shape and snr(got, want) > 30


def captured(v, lanes) -> int:
    """Graphs held by the two lanes' vocoders (each its generator's and its flow's)."""
    parts = (v, lanes.first.vocoder)
    return sum(len(p.runner.graphs) + len(p.decoder.graphs) for p in parts)


def snr(got: np.ndarray, want: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(want.astype(np.float64) ** 2) / max(np.sum((got - want).astype(np.float64) ** 2), 1e-30)))


def test_exclusive_work_waits_for_the_call_running_and_holds_the_next():
    """capture.exclusive (a voice's prefix recorded while serving): it begins once the call running ends, no call runs
    beside it, and the calls go on after it."""
    from services.vocoder.capture import exclusive

    t, gate = Timeline(), DeviceGate()
    with busy_worker(gate, t):
        time.sleep(0.05)
        for _ in range(3):
            with exclusive(gate):
                t.span("capture", 0.03)
            time.sleep(0.03)
        assert t.overlaps("capture", "call") == [] and timeline_calls_after(t, "capture") > 0
        with exclusive(None) as alone:  # no gate: nothing to wait for
            assert alone


def test_holders_of_the_gate_come_one_at_a_time():
    """Voices added on several threads at once, beside a capture while serving and a busy worker: no two of them hold
    the device together, and none beside a call."""
    from services.vocoder.capture import exclusive

    t, gate = Timeline(), DeviceGate()

    def adder():
        for _ in range(3):
            with exclusive(gate):
                t.span("capture", 0.01)

    with busy_worker(gate, t):
        background = BackgroundCapture([shape(b, t, 0.01, None) for b in (2, 3)], gate, lambda s: s.capture(),
                                       idle_seconds=0.0).start()
        adders = [threading.Thread(target=adder) for _ in range(3)]
        for a in adders:
            a.start()
        for a in adders:
            a.join(10)
        background.stop()
    held = sorted(s for s in t.spans if s[0] == "capture")
    assert len(held) >= 9
    assert all(a[2] <= b[1] for a, b in zip(held, held[1:]))  # one after another
    assert t.overlaps("capture", "call") == []
