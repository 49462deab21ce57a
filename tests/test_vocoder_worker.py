"""The vocoder's batching worker: earliest deadline first; many streams in one model call with the
audio each gives alone; a bad stream fails alone; a cancelled chunk is dropped; waits are bounded."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from services.common.errors import InvalidArgument
from services.vocoder.loader import load_vocoder
from services.vocoder.streamer import MelStreamer
from services.vocoder.worker import Job, VocoderWorker


class Recording:
    """A TokenVocoder stand-in: records each call's streams and can hold a call until released."""

    def __init__(self, vocoder):
        self.vocoder, self.calls, self.gate = vocoder, [], threading.Event()
        self.gate.set()

    def __getattr__(self, name):
        return getattr(self.vocoder, name)

    def launch(self, windows, last, conditions=None):
        self.calls.append([w.shape[1] for w in windows])
        self.gate.wait(10)
        return self.vocoder.launch(windows, last, conditions)


@pytest.fixture(scope="module")
def vocoder():
    return load_vocoder(None, "tiny")


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


def calls_after_a_held_call(vocoder, chunks, **worker_options) -> list[list[int]]:
    """A worker whose model is held by a first call while `chunks(now)` are queued: (tokens, seed, audio_started,
    audio_sent) each, `now` when the hold began → the window lengths of each call after the held one (8 frames)."""
    rec = Recording(vocoder)
    worker = VocoderWorker(rec, max_wait=0.0, **worker_options)
    try:
        rec.gate.clear()
        blocker = worker.submit(Job(MelStreamer(rec), tokens(2, 0), None, 0.0))  # holds the model
        while not rec.calls:
            time.sleep(0.001)
        now = time.perf_counter()
        queued = [worker.submit(Job(MelStreamer(rec), tokens(n, seed), started, sent))
                  for n, seed, started, sent in chunks(now)]
        rec.gate.set()
        for f in [blocker, *queued]:
            f.result(timeout=20)
        assert rec.calls[0] == [8]
        return rec.calls[1:]
    finally:
        worker.stop()


@pytest.mark.parametrize("budget, order", [
    (0.2, [[12], [16], [20], [24]]),  # a first chunk due 0.2 s after it came in: between 0.1 s and 0.4 s of slack
    (0.0, [[16], [12], [20], [24]]),  # no budget: the first chunk before every stream still playing
])
def test_earliest_deadline_first(vocoder, budget, order):
    # Window lengths tell the calls apart: 3, 4, 5 and 6 tokens → 12, 16, 20 and 24 frames (lookahead 4 held back but
    # computed), each a stream's first window (audio_started says what the listener has).
    def chunks(now):
        return [(6, 1, now - 1.0, 6.0),   # 5 s of slack
                (5, 2, now - 1.0, 1.4),   # 0.4 s of slack
                (3, 3, now - 1.0, 1.1),   # 0.1 s of slack
                (4, 4, None, 0.0)]        # a first chunk: nothing playing yet

    assert calls_after_a_held_call(vocoder, chunks, max_batch=1, first_chunk_budget=budget) == order


def test_a_call_holds_at_most_max_batch_frames_but_always_one_window(vocoder):
    # First windows of 5 tokens are 20 frames (the lookahead's 4 computed, held back): two fit in 45; 20 tokens are 80
    # frames: over, alone.
    def chunks(now):
        return [(5, i, None, 0.0) for i in range(1, 5)] + [(20, 9, None, 0.0)]

    calls = calls_after_a_held_call(vocoder, chunks, max_batch=16, max_batch_frames=45)
    assert calls == [[20, 20], [20, 20], [80]]


@pytest.mark.parametrize("first_chunk_batch_frames, calls", [
    (45, [[20, 20], [20, 20]]),  # the first chunk's call stops at 45 frames; the playing ones go next
    (0, [[20, 20, 20, 20]]),     # no cap of its own: one call of up to max_batch_frames
])
def test_a_call_carrying_a_first_chunk_holds_at_most_first_chunk_batch_frames(vocoder, first_chunk_batch_frames, calls):
    # A first chunk (20 frames) is due before three playing streams' chunks (20 frames each, their first windows too,
    # and 1 s of slack). A second chunk (0.32 s of audio out) does not shorten a call.
    def chunks(now):
        return [(5, 1, None, 0.0), (5, 2, now - 0.1, 0.32)] + [(5, i, now - 1.0, 2.0) for i in range(3, 5)]

    assert calls_after_a_held_call(vocoder, chunks, max_batch=16, max_batch_frames=200,
                                   first_chunk_batch_frames=first_chunk_batch_frames) == calls


@pytest.mark.parametrize("urgent_seconds, calls", [
    (0.5, [[20, 20], [20, 20]]),  # the second chunk's call takes the chunk due within 0.5 s, not the relaxed ones
    (0.0, [[20, 20, 20, 20]]),    # off: one call of everything ready
])
def test_a_call_led_by_an_urgent_chunk_takes_only_chunks_due_as_soon(vocoder, urgent_seconds, calls):
    # A stream's second chunk (0.32 s of audio out 0.1 s ago: 0.22 s of slack) and a chunk with 0.4 s; two playing
    # streams' chunks with 5 s to spare (20 frames each: their first windows, as above).
    def chunks(now):
        return [(5, 1, now - 0.1, 0.32), (5, 2, now - 1.0, 1.4)] + [(5, i, now - 1.0, 6.0) for i in range(3, 5)]

    assert calls_after_a_held_call(vocoder, chunks, max_batch=16, max_batch_frames=200,
                                   urgent_seconds=urgent_seconds) == calls


def test_streams_vocoded_together_give_what_each_gives_alone(vocoder):
    schedules = [[3, 10, 10, 2], [3, 1, 1, 7], [5, 10], [2]]
    alone = []
    for i, schedule in enumerate(schedules):
        s = MelStreamer(vocoder)
        ids = tokens(sum(schedule), i)
        parts, at = [], 0
        for n in schedule:
            parts.append(s.push(ids[at : at + n]))
            at += n
        alone.append(np.concatenate(parts + [s.flush()]))
    rec = Recording(vocoder)
    worker = VocoderWorker(rec, max_batch=64, max_wait=0.01)
    try:
        streamers = [MelStreamer(rec) for _ in schedules]
        out = [[] for _ in schedules]
        at = [0] * len(schedules)
        for step in range(max(len(s) for s in schedules) + 1):
            futures = []
            for i, schedule in enumerate(schedules):
                if step < len(schedule):
                    ids = tokens(sum(schedule), i)[at[i] : at[i] + schedule[step]]
                    at[i] += schedule[step]
                    futures.append((i, worker.submit(Job(streamers[i], ids, None, 0.0))))
                elif step == len(schedule):
                    futures.append((i, worker.submit(Job(streamers[i], None, None, 0.0))))
            for i, f in futures:
                out[i].append(f.result(timeout=30).samples)
        for i in range(len(schedules)):
            np.testing.assert_allclose(np.concatenate(out[i]), alone[i], rtol=1e-5, atol=1e-6)
        assert max(len(c) for c in rec.calls) > 1, "no call batched several streams"
    finally:
        worker.stop()


def test_a_bad_stream_fails_alone_and_a_cancelled_chunk_is_dropped(vocoder):
    rec = Recording(vocoder)
    worker = VocoderWorker(rec, max_batch=8, max_wait=0.05)
    try:
        rec.gate.clear()
        blocker = worker.submit(Job(MelStreamer(rec), tokens(2, 0), None, 0.0))
        while not rec.calls:
            time.sleep(0.001)
        good = worker.submit(Job(MelStreamer(rec), tokens(3, 1), None, 0.0))
        bad = worker.submit(Job(MelStreamer(rec), [5, 10**6], None, 0.0))  # not a code: the decoder raises
        gone = worker.submit(Job(MelStreamer(rec), tokens(3, 2), None, 0.0))
        assert gone.cancel()
        rec.gate.set()
        blocker.result(timeout=20)
        assert len(good.result(timeout=20).samples) > 0
        with pytest.raises(IndexError):
            bad.result(timeout=20)
        assert rec.calls[1:] == [[12]], "the bad and the cancelled stream reached the model"
        ended = MelStreamer(rec)
        worker.submit(Job(ended, tokens(2, 4), None, 0.0)).result(timeout=20)
        worker.submit(Job(ended, None, None, 0.0)).result(timeout=20)
        with pytest.raises(InvalidArgument, match="already ended"):  # a chunk after the stream's end
            worker.submit(Job(ended, tokens(2, 5), None, 0.0)).result(timeout=20)
        assert len(worker.submit(Job(MelStreamer(rec), tokens(2, 3), None, 0.0)).result(timeout=20).samples) > 0
    finally:
        worker.stop()


def test_waits_for_company_are_bounded(vocoder):
    worker = VocoderWorker(Recording(vocoder), max_batch=64, max_wait=0.2)
    try:
        t = time.perf_counter()
        worker.submit(Job(MelStreamer(vocoder), tokens(3, 0), None, 0.0)).result(timeout=20)
        assert time.perf_counter() - t < 0.15, "a first chunk waited for company"
        s = MelStreamer(vocoder)
        s.push(tokens(3, 1))
        t = time.perf_counter()
        worker.submit(Job(s, tokens(3, 2), time.perf_counter(), 10.0)).result(timeout=20)  # 10 s of slack
        assert 0.15 <= time.perf_counter() - t < 1.0
    finally:
        worker.stop()


def test_each_pass_of_the_token_decoder_and_call_of_the_generator_is_reported_once_per_call(vocoder):
    """on_decode and on_generate: one report each per model call that decoded tokens and vocoded windows (their
    seconds within the call's), none for a call whose jobs bring no tokens and have no window due."""
    decodes, generates, batches = [], [], []
    worker = VocoderWorker(vocoder, max_batch=4, max_wait=0.0, on_decode=decodes.append, on_generate=generates.append,
                           on_batch=lambda size, seconds: batches.append(seconds))
    try:
        streamer = MelStreamer(vocoder)
        worker.submit(Job(streamer, tokens(6, 1), None, 0.0)).result(timeout=20)
        assert len(decodes) == len(generates) == len(batches) == 1
        assert 0 < decodes[0] <= batches[0] and 0 < generates[0] <= batches[0]
        worker.submit(Job(streamer, [], time.perf_counter(), 0.2)).result(timeout=20)  # no tokens: nothing decoded
        assert len(decodes) == len(generates) == 1
    finally:
        worker.stop()


class PoisonedMel(MelStreamer):
    """A stream whose next window's mel gets a NaN frame (as a flow gone wrong would give): `poison` windows of it."""

    poison = 0

    def prepare(self, tokens, decoded=None):
        window = super().prepare(tokens, decoded)
        if self.poison and window.mel is not None:
            self.poison -= 1
            window.mel = window.mel.clone()
            window.mel[:, window.upto - window.start - 1] = float("nan")  # a frame whose samples are kept
        return window


class NanSamples(Recording):
    """A generator whose samples of the call's first window come back with NaN and inf in them."""

    def samples(self, generation):
        wavs = self.vocoder.samples(generation)
        wavs[0][:3] = [np.nan, np.inf, -np.inf]
        return wavs


def run_streams(worker, streamers, chunks):
    """Each stream's token chunks (then its end) submitted together, chunk by chunk → each stream's samples."""
    out = [[] for _ in streamers]
    for step in range(len(chunks[0]) + 1):
        futures = [worker.submit(Job(s, chunks[i][step] if step < len(chunks[i]) else None, None, 0.0))
                   for i, s in enumerate(streamers)]
        for i, f in enumerate(futures):
            out[i].append(f.result(timeout=30).samples)
    return [np.concatenate(o) for o in out]


def test_nan_in_a_streams_mel_is_sent_as_silence_counted_and_leaves_its_batch_mates_alone(vocoder):
    chunks = [[tokens(4, 10 + i), tokens(6, 20 + i), tokens(6, 30 + i)] for i in range(2)]
    alone = run_streams(VocoderWorker(vocoder, max_batch=1, max_wait=0.0), [MelStreamer(vocoder)], chunks[1:])[0]
    seen = []
    worker = VocoderWorker(Recording(vocoder), max_batch=8, max_wait=0.05,
                           on_nonfinite=lambda stage, samples: seen.append((stage, samples)))
    try:
        poisoned, clean = PoisonedMel(vocoder), MelStreamer(vocoder)
        poisoned.poison = 1
        got = run_streams(worker, [poisoned, clean], chunks)
    finally:
        worker.stop()
    assert all(np.isfinite(g).all() for g in got)
    assert seen and seen[0][0] == "mel" and seen[0][1] > 0, seen
    assert all(stage == "mel" for stage, _ in seen)
    assert sum(n for _, n in seen) == int(np.count_nonzero(got[0] == 0.0)), "zeroed samples and the count differ"
    np.testing.assert_allclose(got[1], alone, rtol=1e-5, atol=1e-6)  # its batch mate: as it was alone
    hop = vocoder.hop_size
    assert np.count_nonzero(got[0][-4 * hop :]) > 0, "the poisoned stream stayed silent to its end"


def test_nan_and_inf_in_the_generators_samples_are_sent_as_silence_and_counted(vocoder):
    seen = []
    worker = VocoderWorker(NanSamples(vocoder), max_batch=8, max_wait=0.0,
                           on_nonfinite=lambda stage, samples: seen.append((stage, samples)))
    try:
        samples = worker.submit(Job(MelStreamer(vocoder), tokens(6, 1), None, 0.0)).result(timeout=30).samples
    finally:
        worker.stop()
    assert seen == [("generator", 3)]
    assert np.isfinite(samples).all() and (samples[:3] == 0).all()


def test_a_nan_source_phase_starts_the_streams_source_again_instead_of_holding_for_the_rest_of_it():
    codec = load_vocoder(None, "tiny-codec")
    s = MelStreamer(codec)
    window = s.prepare(tokens(8, 3))
    assert window.mel is not None and window.conditions
    samples = np.zeros((window.upto - window.start) * codec.hop_size, dtype=np.float32)
    s.commit(window, (samples, [torch.full((codec.harmonics,), float("nan"))]))
    assert torch.equal(s.source_phase, torch.zeros(codec.harmonics))
    phase = torch.arange(codec.harmonics, dtype=torch.float32) / 10
    window = s.prepare(tokens(8, 4))
    s.commit(window, (np.zeros((window.upto - window.start) * codec.hop_size, dtype=np.float32), [phase]))
    assert torch.equal(s.source_phase, phase), "a finite phase is kept as it came"
