"""One thread owns the encoder's device and encodes the speech of many speakers together.

Streams hand in jobs (a speaker's next samples, or the end of the turn) and await them. The worker takes every job
that is ready, `max_batch` streams at most, and runs them as one call: every new sample through the encoder at once
(stream.feed_streams), every ended turn's last frames at once (stream.finish_streams). A speaker whose audio came in
several chunks while the call before ran has all of it in this call (the front end's work is per speaker and call,
not per sample: one job a stream a call fell behind at 64 speakers sending 100 ms chunks; docs/benchmarks.md). A job
waits for company at most `max_wait` seconds, and an end of turn never waits: its codes are what the reply waits
for, so a round with ends in it takes only the ended streams (their last audio, then their ends). A failed call fails
the jobs in it. A stream's slot goes back when its caller aborts it (`abort`), on this thread between two calls:
never while a call it is in may still write to the slot.

No asyncio here: `submit` returns a concurrent future; the servicer wraps it, so the gRPC event loop never blocks on
the model.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from services.common.job_thread import JobThread
from services.encoder.stream import EncoderStream, feed_streams, finish_streams

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    stream: EncoderStream
    samples: torch.Tensor | None        # None: the end of the turn (its future gets the turn's codes)
    submitted: float = field(default_factory=time.perf_counter)
    future: Future = field(default_factory=Future)
    followers: list[Job] = field(default_factory=list)  # the same stream's later samples, fed with these in one call

    def all(self) -> list[Job]:
        return [self, *self.followers]


# How long speakers' audio waits for company. Nothing reads a turn's codes before its end, and an end never waits, so
# the wait costs no reply any time; a call's cost is mostly fixed (its kernels), so fewer, fuller calls leave the GPU
# to the llm and the vocoder. At 2 ms, 114 speakers on an H200 made calls of 4 speakers on average, one after another.
FEED_WAIT_SECONDS = 0.04


class EncoderWorker(JobThread):
    what = "encoder worker"

    def __init__(self, max_batch: int = 64, max_wait: float = FEED_WAIT_SECONDS, name: str = "encoder-worker",
                 on_batch=lambda size, seconds: None):
        """on_batch(streams, seconds): after each model call (metrics)."""
        super().__init__(name)
        self.max_batch, self.max_wait, self.on_batch = max_batch, max_wait, on_batch
        self.batches = 0  # calls made (tests, metrics)
        self.aborts: list[EncoderStream] = []
        self.start()

    def abort(self, stream: EncoderStream) -> None:
        """Drop the stream (cancelled, or its caller gone): its jobs not yet run fail, and its slot goes back before
        the next call. Idempotent; a stopped worker frees it at once (no call can run any more)."""
        with self.cv:
            if not self.thread.is_alive():
                stream.abort()
                return
            self.aborts.append(stream)
            self.cv.notify()

    def _abort_pending(self) -> None:
        """(Under cv.) The aborted streams' slots back, their waiting jobs failed."""
        aborted = {id(stream) for stream in self.aborts}
        for stream in self.aborts:
            stream.abort()
        self.aborts = []
        for job in [job for job in self.pending if id(job.stream) in aborted]:
            self.pending.remove(job)
            if job.future.set_running_or_notify_cancel():  # (a caller that gave up has cancelled it)
                job.future.set_exception(RuntimeError("the stream was aborted"))

    def _take(self) -> list[Job] | None:
        """Wait for work → the next batch, oldest first, one job per stream (None: stopping)."""
        with self.cv:
            while not self.pending and not self.stopping:
                if self.aborts:
                    self._abort_pending()
                    continue
                self.cv.wait()
            self._abort_pending()
            if self.stopping:
                for job in self.pending:
                    if job.future.set_running_or_notify_cancel():
                        job.future.set_exception(RuntimeError("the encoder worker has stopped"))
                return None
            if not self.pending:  # every job waiting was an aborted stream's
                return []
            deadline = self.pending[0].submitted + self.max_wait
            while len(self.pending) < self.max_batch and not self.stopping:
                now = time.perf_counter()
                if now >= deadline or any(job.samples is None for job in self.pending):
                    break  # an end of turn waits for nobody
                self.cv.wait(deadline - now)
                self._abort_pending()  # (a place let go while the audio waits for company: back now, between calls)
            if not self.pending:  # (all of it an aborted stream's)
                return []
            # An ended turn's codes are what its reply waits for: the ended streams' last audio and their ends go in a
            # round of their own, ahead of the other speakers' audio (the rest of their speech is still to come). At
            # 114 speakers on an H200 an end waited behind two calls of everyone's audio: 92 ms mean, 207 ms p90.
            ending = {id(job.stream) for job in self.pending if job.samples is None}
            batch, heads, left = [], {}, []
            for job in self.pending:
                head = heads.get(id(job.stream), False)
                if ending and id(job.stream) not in ending:
                    left.append(job)  # a speaker still talking: the next round
                elif head is False and len(batch) < self.max_batch:
                    heads[id(job.stream)] = job
                    batch.append(job)
                elif head and head.samples is not None and job.samples is not None:
                    head.followers.append(job)  # more of the speaker's audio: in this call, after the head's
                elif head and head.samples is not None:
                    batch.append(job)  # its end: in this round's finishing call, right after its audio's call
                    heads[id(job.stream)] = None
                else:  # a stream's end, and whatever follows it (or a stream beyond max_batch): a later call, in order
                    heads[id(job.stream)] = None
                    left.append(job)
            self.pending = left
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            live = {id(job): [j for j in job.all() if j.future.set_running_or_notify_cancel()] for job in batch}
            for job in [job for job in batch if job.stream.done]:  # a stream's own fault ends that job alone
                _settle(live[id(job)], exc=ValueError("audio after the end of the turn"))
                batch.remove(job)
            feeds = [job for job in batch if job.samples is not None]
            ends = [job for job in batch if job.samples is None]  # (after the feeds: a stream's end follows its audio)
            for jobs, run in ((feeds, lambda js: feed_streams([(j.stream, torch.cat([f.samples for f in j.all()]))
                                                               for j in js])),
                              (ends, lambda js: finish_streams([j.stream for j in js]))):
                if not jobs:
                    continue
                started = time.perf_counter()
                try:
                    results = run(jobs) or [None] * len(jobs)
                    self.batches += 1
                    self.on_batch(len(jobs), time.perf_counter() - started)
                except Exception as exc:  # noqa: BLE001  a bug here must not stop the thread every stream waits on
                    log.exception("encoder: a batch failed")
                    for job in jobs:
                        _settle(live[id(job)], exc=exc)
                    continue
                for job, result in zip(jobs, results):
                    _settle(live[id(job)], result)


def _settle(jobs: list[Job], result=None, exc: BaseException | None = None) -> None:
    """The futures of a job and its followers (those whose callers still wait)."""
    for job in jobs:
        if exc is not None:
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)
