"""The vocoder's worker driving the flow's solve (solve_worker.py): streams get the samples that flow calls give them
(worker.py), whatever joins the solve beside them; a stream without a history slot, a chunk of several rows, a cancel
while a row flies and a stop all behave (tiny-codec, CPU, float32, random weights)."""

from __future__ import annotations

import time
from concurrent.futures import CancelledError

import numpy as np
import pytest
import torch

from services.vocoder.codec.solve import FlowSolve
from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.solve_worker import SolveWorker
from services.vocoder.streamer import MelStreamer
from services.vocoder.worker import Job, VocoderWorker

# (tokens, chunk schedule, first round): the gateway's chunks, a late starter, and a whole stream in one chunk
# (more frames than one row solves: several rows in turn).
STREAMS = [(43, [8, 5, 10, 20], 0), (30, [8, 5, 17], 2), (45, [45], 1), (25, [8, 17], 3)]


def codes(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


def drive(vocoder, worker, streams=STREAMS) -> list[np.ndarray]:
    """Each stream's samples, its chunks handed in round by round (every stream's next chunk in a round, then all
    awaited), then its end."""
    streamers = [MelStreamer(vocoder) for _ in streams]
    out: list[list[np.ndarray]] = [[] for _ in streams]
    at, sent, ended = [0] * len(streams), [0] * len(streams), [False] * len(streams)
    for r in range(12):
        futures = []
        for i, ((n, schedule, first), s) in enumerate(zip(streams, streamers)):
            k = r - first
            if ended[i] or k < 0:
                continue
            tokens = codes(n, seed=i)
            if k < len(schedule):
                chunk = tokens[at[i] : at[i] + schedule[k]]
                at[i] += len(chunk)
                futures.append((i, worker.submit(Job(s, chunk, None if r == first else 0.0, sent[i] / 24000))))
            else:
                futures.append((i, worker.submit(Job(s, None, 0.0, sent[i] / 24000))))
                ended[i] = True
        for i, future in futures:
            samples = future.result(timeout=120).samples
            out[i].append(samples)
            sent[i] += len(samples)
    for s in streamers:
        s.close()
    return [np.concatenate(pieces) for pieces in out]


def driven(vocoder, worker) -> list[np.ndarray]:
    """drive() through the worker, stopped afterwards."""
    try:
        return drive(vocoder, worker)
    finally:
        worker.stop()


def snr(got: np.ndarray, want: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(want**2) / max(np.sum((got - want) ** 2), 1e-30)))


@pytest.fixture(scope="module")
def vocoder():
    return load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=4))


@pytest.fixture(scope="module")
def calls(vocoder) -> list[np.ndarray]:
    return driven(vocoder, VocoderWorker(vocoder, max_wait=0.01))


def solve_worker(vocoder, capacity: int = 4, **options) -> SolveWorker:
    return SolveWorker(vocoder, FlowSolve(vocoder.decoder, capacity), max_wait=0.01, **options)


@pytest.mark.parametrize("admit_every", [1, 5])
def test_streams_through_the_solve_get_what_flow_calls_give_them(vocoder, calls, admit_every):
    """Every stream's samples as flow calls give them, with admissions every tick or every 5 (generator calls
    launched without waiting, their samples delivered once in)."""
    seen = []
    worker = solve_worker(vocoder, admit_every=admit_every, on_solve=lambda kind, rows, s: seen.append((kind, rows)))
    got = driven(vocoder, worker)
    for i, (g, want) in enumerate(zip(got, calls)):
        assert len(g) == len(want) == STREAMS[i][0] * vocoder.samples_per_token, i
        np.testing.assert_allclose(g, want, atol=2e-4, rtol=0, err_msg=f"stream {i}")
    ticks = [rows for kind, rows in seen if kind == "tick"]
    assert max(ticks) >= 2, "no tick ran rows of two streams"
    assert any(kind == "admit" for kind, _ in seen)
    assert vocoder.decoder.history.held == 0 and worker.solve.room == 4


def test_a_stream_without_a_history_slot_is_decoded_over_its_window_beside_the_solve(calls):
    """One slot for four streams: the first to come holds it, the others are decoded in flow calls between ticks."""
    v = load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=1))
    got = driven(v, solve_worker(v))
    for i, (g, want) in enumerate(zip(got, calls)):
        assert len(g) == len(want), i
        # the window's decode solves frames the history keeps instead: the same to float error, not bit for bit
        assert snr(g, want) > 40, i


def test_a_chunk_cancelled_while_its_row_flies_frees_its_place_and_slot(vocoder):
    started = []
    worker = solve_worker(vocoder, on_solve=lambda kind, rows, s: started.append(kind))
    try:
        gone, kept = MelStreamer(vocoder), MelStreamer(vocoder)
        doomed = worker.submit(Job(gone, codes(60, seed=1), None, 0.0))  # a whole stream in one chunk: several rows
        while "tick" not in started:
            time.sleep(0.001)
        assert doomed.cancel(), "a chunk in the solve can be cancelled"
        gone.close()                                                     # (the servicer closes it on a cancel)
        assert len(worker.submit(Job(kept, codes(8, seed=2), None, 0.0)).result(timeout=60).samples) > 0
        with pytest.raises(CancelledError):
            doomed.result(timeout=0)
        deadline = time.monotonic() + 30
        while worker.solve.flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.solve.room == 4
        assert vocoder.decoder.history.held == 1                         # the cancelled one's is free, once out
        kept.close()
        assert vocoder.decoder.history.held == 0
    finally:
        worker.stop()


def test_stopping_fails_the_chunks_it_holds(vocoder):
    worker = solve_worker(vocoder, admit_every=50)
    s = MelStreamer(vocoder)
    future = worker.submit(Job(s, codes(60, seed=4), None, 0.0))
    worker.stop()
    with pytest.raises(RuntimeError):
        future.result(timeout=30)
    s.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the solve's CUDA graphs: needs a GPU")
def test_on_cuda_the_solves_graphs_give_what_flow_calls_give():
    """bf16 with the kernels, the solve's ticks and admissions replayed from graphs: each stream within bf16's error of
    the same streams through flow calls' graphs."""
    v = load_vocoder(None, "tiny-codec", device="cuda", flow=FlowOptions(history_streams=4))
    v.decoder.warm_up(list(v.voices.values()), 4)
    want = driven(v, VocoderWorker(v, max_wait=0.01))
    solve = FlowSolve(v.decoder, 4)
    solve.warm_up()
    assert solve.graphs
    got = driven(v, SolveWorker(v, solve, max_wait=0.01))
    for i, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), i
        assert snr(g, w) > 20, i
