"""The wait for arrivals before a step is launched behind the running one (engine.arrival_wait, issue 23): its
arithmetic on a stepping engine's timings, and the driver's use of it — a request that arrives while it waits is in
the next step, a step that ends sooner ends the wait, and without arrivals the next step is launched `ahead_margin`
before the running one is expected to end."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from services.llm.async_engine import AsyncEngine
from services.llm.engine.engine import EngineConfig, EngineLoad, LLMEngine, StepStats
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer

CFG = tiny_config()


def running_step(start: float, done: bool = False) -> SimpleNamespace:
    """An in-flight step as arrival_wait reads it: launched at `start`, finished on the device or not."""
    return SimpleNamespace(start=start, samples=SimpleNamespace(done=lambda: done))


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(random_model(CFG, seed=5), tiny_tokenizer(CFG), EngineConfig(kv_cache_bytes=1 << 22, ahead_margin=0.002))


def test_the_next_step_is_due_a_margin_before_the_running_one_is_expected_to_end(engine):
    engine.decode_seconds, engine.last_done = 0.010, 100.0
    # Launched while its predecessor ran: it started on the device when that one ended.
    engine.inflight = running_step(start=99.995)
    try:
        assert engine.arrival_wait(100.001) == pytest.approx(100.0 + 0.010 - 0.002 - 100.001)
        # Launched after its predecessor ended: from its launch.
        engine.inflight = running_step(start=100.004)
        assert engine.arrival_wait(100.005) == pytest.approx(100.004 + 0.010 - 0.002 - 100.005)
        assert engine.arrival_wait(100.013) == 0.0  # past due: step now
        assert not engine.inflight_done()
        engine.inflight = running_step(start=100.004, done=True)
        assert engine.inflight_done()
    finally:
        engine.inflight = None
    assert engine.arrival_wait(100.005) == 0.0  # nothing running: nothing to launch behind


def test_no_wait_without_a_margin_a_mean_or_with_a_request_waiting(engine):
    engine.last_done, engine.inflight = 100.0, running_step(start=100.0)
    try:
        engine.decode_seconds = 0.0  # no decode step measured yet
        assert engine.arrival_wait(100.001) == 0.0
        engine.decode_seconds = 0.010
        engine.scheduler.waiting.append(object())  # it waits for admission: no step goes ahead of it
        try:
            assert engine.arrival_wait(100.001) == 0.0
        finally:
            engine.scheduler.waiting.pop()
        engine.config = EngineConfig(kv_cache_bytes=1 << 22, ahead_margin=0.0)
        assert engine.arrival_wait(100.001) == 0.0
    finally:
        engine.inflight, engine.config = None, EngineConfig(kv_cache_bytes=1 << 22, ahead_margin=0.002)


def test_decode_seconds_follows_decode_steps_and_not_prefills(engine):
    engine.decode_seconds, engine.last_done = 0.0, 0.0
    engine.record(StepStats(decode_tokens=4), 1.0, 4, engine._marks(), 1.010)
    assert engine.decode_seconds == pytest.approx(0.010)
    engine.record(StepStats(prefill_tokens=300), 1.010, 1, engine._marks(), 1.060)  # a 50 ms prefill
    assert engine.decode_seconds == pytest.approx(0.010)
    engine.record(StepStats(decode_tokens=4), 1.060, 4, engine._marks(), 1.080)  # 20 ms
    assert 0.010 < engine.decode_seconds < 0.020


class SteppingEngine:
    """The engine as the driver sees it: every step leaves one running on the 'device' for `step_seconds`."""

    def __init__(self, step_seconds: float, margin: float, ends_after: float | None = None):
        self.step_seconds, self.margin, self.ends_after = step_seconds, margin, ends_after
        self.waiting: list = []
        self.steps: list[tuple[float, int]] = []  # (when step() was called, requests waiting then)
        self.last_step = StepStats()
        self.running_since = 0.0
        self.lock = threading.Lock()

    def has_work(self) -> bool:
        return True

    def hold_seconds(self) -> float:
        return 0.0

    def arrival_wait(self, now: float) -> float:
        if self.waiting:
            return 0.0
        return max(0.0, self.running_since + self.step_seconds - self.margin - now)

    def inflight_done(self) -> bool:
        return self.ends_after is not None and time.perf_counter() >= self.running_since + self.ends_after

    def add(self, seq) -> None:
        self.waiting.append(seq)

    def abort(self, seq_id: int) -> bool:
        return False

    def step(self) -> list:
        with self.lock:
            self.steps.append((time.perf_counter(), len(self.waiting)))
        self.waiting.clear()
        self.running_since = time.perf_counter()
        return []

    def load(self) -> EngineLoad:
        return EngineLoad(0, len(self.waiting), 0, 0, 0)


def drive(engine: SteppingEngine, seconds: float, arrive_at: float | None = None) -> list[tuple[float, int]]:
    driver = AsyncEngine(engine)
    driver.start()
    try:
        if arrive_at is not None:
            time.sleep(arrive_at)
            driver._inbox.put(SimpleNamespace(seq_id=1))
        time.sleep(seconds - (arrive_at or 0.0))
    finally:
        driver.stop()
    with engine.lock:
        return list(engine.steps)


def test_without_arrivals_steps_launch_a_margin_before_the_running_one_ends():
    steps = drive(SteppingEngine(step_seconds=0.2, margin=0.05), seconds=0.75)
    gaps = [b - a for (a, _), (b, _) in zip(steps, steps[1:])]
    assert len(gaps) >= 2
    assert all(0.13 < gap < 0.2 for gap in gaps), gaps  # 0.15: the step's 0.2 less the margin


def test_a_request_that_arrives_during_the_wait_is_in_the_next_step():
    steps = drive(SteppingEngine(step_seconds=1.0, margin=0.05), seconds=0.5, arrive_at=0.2)
    assert len(steps) == 2, steps  # the first, then one at once for the request, not at 0.95 s
    (first, _), (second, waiting) = steps
    assert waiting == 1
    assert 0.15 < second - first < 0.4


def test_a_step_that_ends_sooner_ends_the_wait():
    steps = drive(SteppingEngine(step_seconds=1.0, margin=0.05, ends_after=0.1), seconds=0.55)
    gaps = [b - a for (a, _), (b, _) in zip(steps, steps[1:])]
    assert len(gaps) >= 3 and all(gap < 0.2 for gap in gaps), gaps
