"""The pipelined playing worker (`--generator-overlap on`, pipelined_worker.py): each call's generator beside the next
call's token decoder. Each stream sounds as it does alone (the codec's flow and HiFT, whose source phase a stream
carries from window to window); the next call's token decoder is queued before the call before it is handed its
samples (and never so by the serial worker); a lone call is handed its samples without waiting for another; stopping,
and a lost device, leave no job waiting."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lanes import run_streams

from services.common.errors import DeviceLost
from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.pipelined_worker import PipelinedWorker
from services.vocoder.streamer import MelStreamer
from services.vocoder.worker import Job, VocoderWorker


def codes(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


@pytest.fixture(scope="module")
def codec():
    return load_vocoder(None, "tiny-codec")


class Logged:
    """A TokenVocoder that logs its token decoder's passes and its generator's calls, in order."""

    def __init__(self, vocoder, log: list[str]):
        self.vocoder, self.log = vocoder, log

    def __getattr__(self, name):
        return getattr(self.vocoder, name)

    def mel_chunks(self, chunks):
        self.log.append("decode")
        return self.vocoder.mel_chunks(chunks)

    def launch(self, windows, last, conditions=None):
        self.log.append("generate")
        return self.vocoder.launch(windows, last, conditions)


def alone(vocoder, tokens: list[int], schedule: list[int]) -> np.ndarray:
    s, pieces, at = MelStreamer(vocoder), [], 0
    for n in schedule:
        pieces.append(s.push(tokens[at : at + n]))
        at += n
    return np.concatenate([*pieces, s.flush()])


@pytest.mark.parametrize("pipelined", [True, False])
def test_each_stream_sounds_as_alone_and_the_next_decode_comes_before_the_samples(codec, pipelined):
    inputs = [(codes(n, seed=n), schedule) for n, schedule in
              ((23, [4, 4, 8, 7]), (30, [8, 5, 10, 7]), (12, [12]), (17, [5, 5, 5, 2]))]
    want = [alone(codec, tokens, schedule) for tokens, schedule in inputs]
    log: list[str] = []
    vocoder = Logged(codec, log)
    worker = (PipelinedWorker if pipelined else VocoderWorker)(
        vocoder, max_batch=2, max_wait=0.02, on_batch=lambda size, seconds: log.append("delivered"))
    try:
        got = run_streams(worker, vocoder, inputs)
    finally:
        worker.stop()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)
    # a call's samples handed over right after the next call's decode was queued, its generator not yet called
    overlapped = any(a == "decode" and b == "delivered" for a, b in zip(log, log[1:]))
    assert overlapped == pipelined, log


def test_a_lone_call_is_handed_its_samples_without_waiting_for_another(codec):
    worker = PipelinedWorker(codec, max_wait=0.0)
    try:
        s = MelStreamer(codec)
        first = worker.submit(Job(s, codes(8, 1), None, 0.0)).result(timeout=30)
        assert len(first.samples) > 0
        assert len(worker.submit(Job(s, None, None, 0.0)).result(timeout=30).samples) > 0
        assert worker.inflight is None
    finally:
        worker.stop()


def test_stopping_with_calls_queued_and_in_flight_leaves_no_job_waiting(codec):
    worker = PipelinedWorker(codec, max_batch=1, max_wait=0.0)
    futures = [worker.submit(Job(MelStreamer(codec), codes(8, seed), None, 0.0)) for seed in range(6)]
    worker.stop()
    for f in futures:
        assert f.done()
    assert worker.inflight is None and not worker.thread.is_alive()


class SamplesLost:
    """A vocoder whose device fails when a call's samples are read back (a generator running beside the next call)."""

    def __init__(self, vocoder):
        self.vocoder = vocoder

    def __getattr__(self, name):
        return getattr(self.vocoder, name)

    @staticmethod
    def samples(generation):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_lost_device_fails_the_call_in_flight_with_the_rest_and_takes_no_more(codec):
    told: list[DeviceLost] = []
    vocoder = SamplesLost(codec)
    worker = PipelinedWorker(vocoder, max_batch=1, max_wait=0.0, lost=lambda: True, on_fatal=told.append)
    try:
        futures = [worker.submit(Job(MelStreamer(vocoder), codes(8, seed), None, 0.0)) for seed in range(4)]
        errors = [f.exception(timeout=30) for f in futures]
        assert all(isinstance(e, DeviceLost) for e in errors), errors
        assert len(told) == 1 and worker.inflight is None
        with pytest.raises(DeviceLost):
            worker.submit(Job(MelStreamer(vocoder), codes(8, 9), None, 0.0))
    finally:
        worker.stop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a generator on a CUDA stream of its own needs a GPU")
def test_on_a_gpu_the_samples_are_the_serial_workers_bit_for_bit():
    """The generator reads each call's mel on a stream of its own while the next call's flow runs, and the flow's
    allocations reuse memory freed on its stream: a hazard there would change samples. A call of one window each, so
    that both workers make the same calls."""
    inputs = [(codes(n, seed=n), schedule) for n, schedule in
              ((33, [8, 5, 10, 10]), (30, [8, 5, 10, 7]), (12, [12]), (27, [8, 5, 10, 4]))]
    out = {}
    for kind in (VocoderWorker, PipelinedWorker):
        vocoder = load_vocoder(None, "tiny-codec", device="cuda", flow=FlowOptions(history_streams=8))
        worker = kind(vocoder, max_batch=1, max_wait=0.0)
        try:
            out[kind] = run_streams(worker, vocoder, inputs)
        finally:
            worker.stop()
        assert (vocoder.runner.stream is not None) == (kind is PipelinedWorker)
    for serial, pipelined in zip(out[VocoderWorker], out[PipelinedWorker]):
        np.testing.assert_array_equal(pipelined, serial)


def test_the_servicer_pipelines_its_playing_calls_when_asked_and_the_server_refuses_it_with_the_solve_or_a_cpu(codec):
    from types import SimpleNamespace

    from services.vocoder.server import check_overlap
    from services.vocoder.servicer import VocoderServicer

    for overlap, kind in ((True, PipelinedWorker), (False, VocoderWorker)):
        servicer = VocoderServicer(codec, overlap=overlap, lane=codec.lane())
        try:
            assert type(servicer.worker.playing) is kind and type(servicer.worker.first) is VocoderWorker
        finally:
            servicer.worker.stop()
            servicer.voice_thread.shutdown()
    check_overlap(SimpleNamespace(generator_overlap="on", device="cuda"), None)  # flow calls on a GPU: served
    check_overlap(SimpleNamespace(generator_overlap="off", device="cpu"), object())
    with pytest.raises(ValueError, match="--flow-solve on"):
        check_overlap(SimpleNamespace(generator_overlap="on", device="cuda"), object())
    with pytest.raises(ValueError, match="--device cuda"):
        check_overlap(SimpleNamespace(generator_overlap="on", device="cpu"), None)
