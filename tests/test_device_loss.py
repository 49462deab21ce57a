"""A service whose GPU context is lost (a sticky CUDA error: seen when an MPS neighbour was killed) fails what it
holds with DeviceLost (UNAVAILABLE), takes nothing more, and stops serving, so that its supervisor starts it
again on a fresh context; a failure that leaves the device working fails only what it touched, as before.
No GPU here: the device's loss is what the `lost` probe says, and the failures are raised by stand-ins."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.device import fatal_signal, lost
from services.common.errors import DeviceLost, Internal
from services.common.sampling import ChunkSettings, SamplingSettings
from services.common.server import FATAL_GRACE_SECONDS, GRACE_SECONDS, serve
from services.llm.async_engine import AsyncEngine
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer
from services.stack import free_port
from services.vocoder.loader import load_vocoder
from services.vocoder.streamer import MelStreamer
from services.vocoder.worker import Job, VocoderWorker

CFG = tiny_config()
LONG = SamplingSettings(max_new_tokens=400, min_new_tokens=400, seed=1)


class Breaking:
    """An LLMEngine whose steps fail once `broken` is set (as a CUDA error would raise from step())."""

    def __init__(self, engine: LLMEngine):
        self.engine, self.broken = engine, threading.Event()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step(self):
        if self.broken.is_set():
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.engine.step()


@pytest.fixture
def engine():
    return Breaking(LLMEngine(random_model(CFG, seed=3), tiny_tokenizer(CFG), EngineConfig(kv_cache_bytes=1 << 22)))


def request(engine, name: str, session: str = "") -> object:
    return engine.make_sequence(GenerationRequest(name, LONG, ChunkSettings(), text="hello", session_id=session))


async def first_then_rest(agen, started: asyncio.Event | None = None):
    """Read a generation's first chunk (then set `started`), then the rest → the error that ended it (None: it
    finished)."""
    await anext(agen)
    if started is not None:
        started.set()
    try:
        async for _ in agen:
            pass
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def test_an_llm_whose_device_is_lost_fails_everything_and_says_so(engine):
    told = []
    driver = AsyncEngine(engine, lost=lambda: True, on_fatal=told.append)
    driver.start()

    async def scenario():
        streaming = asyncio.Event()
        running = asyncio.create_task(first_then_rest(driver.generate(request(engine, "a", session="s")), streaming))
        await asyncio.wait_for(streaming.wait(), 30)
        engine.broken.set()
        err = await asyncio.wait_for(running, 10)
        with pytest.raises(DeviceLost):  # nothing more is taken: at once, not after a wait
            await asyncio.wait_for(anext(driver.generate(request(engine, "b"))), 1)
        closed = await asyncio.wait_for(driver.release_session("s"), 1)
        held = await asyncio.wait_for(driver.hold("a", True), 1)  # answered, not left waiting
        return err, closed, held

    err, closed, held = asyncio.run(scenario())
    assert isinstance(err, DeviceLost) and err.code == "UNAVAILABLE" and "illegal memory access" in str(err)
    assert told == [err] and driver.fatal is err and not closed and not held
    driver._thread.join(5)
    assert not driver._thread.is_alive()  # the engine thread has ended


def test_a_failed_step_on_a_working_device_fails_only_what_it_held(engine):
    told = []
    driver = AsyncEngine(engine, lost=lambda: False, on_fatal=told.append)
    driver.start()

    async def scenario():
        streaming = asyncio.Event()  # (a fixed sleep raced a slow first chunk on a loaded CI machine)
        running = asyncio.create_task(first_then_rest(driver.generate(request(engine, "a")), streaming))
        await asyncio.wait_for(streaming.wait(), 30)
        engine.broken.set()
        err = await asyncio.wait_for(running, 10)
        engine.broken.clear()
        short = SamplingSettings(max_new_tokens=4, seed=1)
        chunks = [c async for c in driver.generate(engine.make_sequence(
            GenerationRequest("b", short, ChunkSettings(), text="again")))]
        return err, chunks

    try:
        err, chunks = asyncio.run(scenario())
    finally:
        driver.stop()
    assert isinstance(err, Internal) and "illegal memory access" in str(err)
    assert chunks[-1].final and not told and driver.fatal is None


class BreakingVocoder:
    def __init__(self, vocoder):
        self.vocoder = vocoder

    def __getattr__(self, name):
        return getattr(self.vocoder, name)

    def launch(self, windows, last, conditions=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


@pytest.mark.parametrize("device_lost", [True, False])
def test_a_vocoder_whose_device_is_lost_fails_every_stream_and_takes_no_more(device_lost):
    vocoder = BreakingVocoder(load_vocoder(None, "tiny"))
    told = []
    worker = VocoderWorker(vocoder, max_batch=2, lost=lambda: device_lost, on_fatal=told.append)
    try:
        tokens = np.arange(6).tolist()
        futures = [worker.submit(Job(MelStreamer(vocoder), tokens, None, 0.0)) for _ in range(3)]
        errors = [f.exception(timeout=10) for f in futures]
        if device_lost:
            assert all(isinstance(e, DeviceLost) for e in errors) and told == [errors[0]]
            with pytest.raises(DeviceLost):
                worker.submit(Job(MelStreamer(vocoder), tokens, None, 0.0))
        else:  # each batch failed alone; the worker goes on
            assert all(isinstance(e, RuntimeError) and not isinstance(e, DeviceLost) for e in errors) and not told
            assert not worker.fatal and worker.thread.is_alive()
    finally:
        worker.stop()


def test_a_cpu_is_never_lost():
    assert not lost("cpu")


def test_serve_stops_and_raises_when_its_work_is_lost():
    """Its running calls are not waited for (a call that would hang for a minute is cut off): on a lost device they
    have been failed already, and a restart of every GPU stage waits for this one to be gone."""
    port = free_port()

    async def hang(request, context):
        await asyncio.sleep(60)
        return b""

    def add_hanging(server):
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "test.Service", {"Hang": grpc.unary_unary_rpc_method_handler(hang)}),))

    async def scenario():
        fatal, report = fatal_signal(asyncio.get_running_loop())
        server = asyncio.create_task(serve(name="test", full_service_name="test.Service", host="127.0.0.1", port=port,
                                           add_servicer=add_hanging, on_done=lambda m, c: None, fatal=fatal))
        target = f"127.0.0.1:{port}"
        async with grpc.aio.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(50):
                try:
                    if (await health.Check(health_pb2.HealthCheckRequest(), timeout=1)).status == 1:
                        break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.05)
            hanging = asyncio.ensure_future(channel.unary_unary("/test.Service/Hang")(b"", timeout=30))
            await asyncio.sleep(0.2)
            assert not hanging.done()
            err = DeviceLost("test: its GPU failed")
            started = time.monotonic()
            threading.Thread(target=report, args=(err,)).start()  # as a worker thread reports it
            with pytest.raises(DeviceLost) as info:
                await asyncio.wait_for(server, 10)
            seconds = time.monotonic() - started
            with pytest.raises(grpc.aio.AioRpcError):
                await hanging
            return info.value is err, seconds

    same, seconds = asyncio.run(scenario())
    assert same and seconds < FATAL_GRACE_SECONDS + 1.5 < GRACE_SECONDS


def test_an_idle_llm_asks_after_its_device_and_goes_when_it_is_lost(engine):
    """Nothing running: a fault elsewhere on the GPU (another MPS client's) is found by asking, every
    probe_seconds, and the service goes as if a step had failed."""
    gone, told = threading.Event(), []
    driver = AsyncEngine(engine, lost=gone.is_set, on_fatal=told.append, probe_seconds=0.05)
    driver.start()
    time.sleep(0.2)
    assert not told and driver._thread.is_alive()  # asked, and it works
    gone.set()
    driver._thread.join(5)
    assert not driver._thread.is_alive() and len(told) == 1 and "while idle" in str(told[0])


def test_an_idle_vocoder_asks_after_its_device_and_goes_when_it_is_lost():
    gone, told = threading.Event(), []
    worker = VocoderWorker(load_vocoder(None, "tiny"), lost=gone.is_set, on_fatal=told.append, probe_seconds=0.05)
    try:
        time.sleep(0.2)
        assert not told and worker.thread.is_alive()
        gone.set()
        worker.thread.join(5)
        assert not worker.thread.is_alive() and len(told) == 1 and "while idle" in str(told[0])
        with pytest.raises(DeviceLost):
            worker.submit(Job(MelStreamer(worker.vocoder), [1, 2, 3], None, 0.0))
    finally:
        worker.stop()


def test_a_device_that_cannot_be_used_is_said_in_a_line(monkeypatch):
    """unusable(): a CPU always serves; CUDA needs a CUDA build, a visible GPU, and its index among them."""
    import torch

    from services.common.device import unusable

    assert unusable("cpu") is None
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "is built without CUDA" in unusable("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA GPU is visible" in unusable("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert unusable("cuda") is None and unusable("cuda:1") is None
    assert "sees 2 GPU(s), cuda:0 to cuda:1" in unusable("cuda:2")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine with a GPU can use --device cuda")
@pytest.mark.parametrize("argv", [["up", "--device", "cuda"], ["llm", "--device", "cuda", "--port", "0"],
                                  ["vocoder", "--device", "cuda:0", "--port", "0"]])
def test_without_a_gpu_cuda_is_refused_in_one_line_before_anything_starts(argv):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "services.cli", *argv], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"moss-serve {argv[0]}: --device cuda") and "CUDA" in lines[0]
