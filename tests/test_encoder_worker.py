"""The encoder's worker (services/encoder/worker.py): speakers talking at once, from their own threads, are encoded
together and each gets the codes of its own speech; a stream's fault stays its own; slots come back."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from services.encoder.checkpoint import random_tokenizer
from services.encoder.config import tiny
from services.encoder.kv_pool import KVPool, PoolFull
from services.encoder.stream import EncoderStream, encode
from services.encoder.worker import EncoderWorker, Job


@pytest.fixture(scope="module")
def model():
    return random_tokenizer(tiny(), seed=2)


@pytest.fixture
def worker():
    w = EncoderWorker(max_batch=8, max_wait=0.005)
    yield w
    w.stop()


def test_speakers_talking_at_once_each_get_their_own_codes(model, worker):
    pool = KVPool(model.cfg, 5)
    turns = [torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.1 for n in (3000, 7000, 13_000, 26_000, 900)]
    got, jobs = {}, []

    def speak(i: int, samples: torch.Tensor) -> None:
        stream, rng, at = EncoderStream(model, pool), random.Random(i), 0
        while at < len(samples):
            n = rng.randint(100, 2500)
            jobs.append(worker.submit(Job(stream, samples[at : at + n])))
            at += n
        got[i] = worker.submit(Job(stream, None)).result(timeout=60)

    threads = [threading.Thread(target=speak, args=(i, s)) for i, s in enumerate(turns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, samples in enumerate(turns):  # 26,000 samples: across two of the tiny config's segments
        assert got[i] == encode(model, samples), i
    assert all(job.done() and job.exception() is None for job in jobs)
    assert worker.batches < len(jobs) + len(turns)  # some calls carried several speakers
    assert pool.used() == 0


def test_audio_after_the_end_fails_that_stream_alone_and_slots_come_back(model, worker):
    pool = KVPool(model.cfg, 2)
    a, b = EncoderStream(model, pool), EncoderStream(model, pool)
    with pytest.raises(PoolFull, match="all 2 encoder slots are in use"):
        EncoderStream(model, pool)
    worker.submit(Job(a, torch.randn(2000) * 0.1)).result(timeout=30)
    assert len(worker.submit(Job(a, None)).result(timeout=30)) == 2  # 2,000 samples: two codes of 1,280
    late = worker.submit(Job(a, torch.randn(500)))
    fine = worker.submit(Job(b, torch.randn(500) * 0.1))
    with pytest.raises(ValueError, match="after the end of the turn"):
        late.result(timeout=30)
    assert fine.result(timeout=30) is None
    b.abort()
    b.abort()  # (idempotent)
    assert pool.used() == 0


def test_a_speakers_chunks_that_waited_are_encoded_in_one_call(model):
    """Chunks of one speaker that came while the worker waited go in one call, in order, and give the same codes."""
    worker = EncoderWorker(max_batch=8, max_wait=0.5)  # (it waits for company long enough to see them all)
    try:
        pool = KVPool(model.cfg, 2)
        samples = torch.randn(9000, generator=torch.Generator().manual_seed(4)) * 0.1
        stream = EncoderStream(model, pool)
        futures = [worker.submit(Job(stream, samples[i : i + 1500])) for i in range(0, 9000, 1500)]
        assert all(f.result(timeout=30) is None for f in futures)
        assert worker.batches == 1
        assert worker.submit(Job(stream, None)).result(timeout=30) == encode(model, samples)
    finally:
        worker.stop()


def test_a_turns_end_that_waited_behind_its_audio_is_finished_in_the_same_round(model):
    worker = EncoderWorker(max_batch=8, max_wait=0.5)
    try:
        samples = torch.randn(5000, generator=torch.Generator().manual_seed(5)) * 0.1
        stream = EncoderStream(model, KVPool(model.cfg, 1))
        feeds = [worker.submit(Job(stream, samples[i : i + 1000])) for i in range(0, 5000, 1000)]
        end = worker.submit(Job(stream, None))
        assert end.result(timeout=30) == encode(model, samples) and all(f.done() for f in feeds)
        assert worker.batches == 2  # one call for the audio, one for the end: one round
    finally:
        worker.stop()


def test_an_ended_turn_goes_ahead_of_the_speakers_still_talking(model):
    """A round with an end in it takes only the ended streams: the ended speaker's last audio, then its end; the
    others' audio waits for the next round, and every speaker's codes are still its own."""
    sizes = []
    worker = EncoderWorker(max_batch=8, max_wait=0.5, on_batch=lambda size, _: sizes.append(size))
    try:
        pool = KVPool(model.cfg, 3)
        talk = [torch.randn(3000, generator=torch.Generator().manual_seed(10 + i)) * 0.1 for i in range(3)]
        streams = [EncoderStream(model, pool) for _ in talk]
        feeds = [worker.submit(Job(s, t)) for s, t in zip(streams, talk)]
        end = worker.submit(Job(streams[1], None))
        assert end.result(timeout=30) == encode(model, talk[1])
        assert all(f.result(timeout=30) is None for f in feeds)
        assert sizes[:3] == [1, 1, 2]  # the ended speaker's audio, its end; then the two still talking
        for s, t in ((streams[0], talk[0]), (streams[2], talk[2])):
            assert worker.submit(Job(s, None)).result(timeout=30) == encode(model, t)
        assert pool.used() == 0
    finally:
        worker.stop()


def test_a_place_let_go_while_audio_waits_for_company_comes_back_at_once(model):
    """A stream aborted while another speaker's audio waits for company (up to max_wait) has its slot back then, not
    after that wait and the call."""
    worker = EncoderWorker(max_batch=8, max_wait=2.0)
    try:
        pool = KVPool(model.cfg, 2)
        talking, leaving = EncoderStream(model, pool), EncoderStream(model, pool)
        feed = worker.submit(Job(talking, torch.randn(1000) * 0.1))    # waits up to 2 s for company
        time.sleep(0.1)
        worker.abort(leaving)
        deadline = time.monotonic() + 1.0
        while pool.used() != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.used() == 1 and not feed.done()
        assert feed.result(timeout=30) is None
    finally:
        worker.stop()
