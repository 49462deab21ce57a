"""One thread owns the vocoder's device and vocodes the chunks of many streams together.

Streams hand in jobs (a stream's new tokens, or its end) and await the samples. The worker takes every
job that is ready, decodes all their tokens to mel frames in one pass of the token decoder, prepares each
stream's window (all of a stream's state is touched on this thread only, one job per stream at a time),
vocodes the windows in one call (runner.py batches those of a frames bucket) and returns each stream its
samples.

Order, when more is ready than one batch takes: earliest deadline first. A playing stream's chunk is due
when its listener runs out of audio (the audio it has sent, from its first samples on); a first chunk is
due `first_chunk_budget` seconds after it was handed in. Why not first chunks always first: when many
streams start at once, their first chunks keep the second chunks of the streams already playing (160 ms
of buffer) waiting behind several calls. A job waits for company at most `max_wait` seconds, and never when a
first chunk or a chunk with less slack than that is queued. Why not longer, to fill calls: on an H100 at Poisson 30
turns a second, chunks held until 0.4-0.8 s of slack was left (and a stream's second chunk on the lane below, so that
it starts no call) made the vocoder's calls 18-25% fewer (and, the second time, turns' first audio sooner on
average), but the admission rule let in 6-20% fewer turns (docs/benchmarks.md, twice).

A call that carries a first chunk holds at most `first_chunk_batch_frames` mel frames: its samples are
time to first audio, and a call's time grows with its frames. The playing streams it leaves for the next
call have the audio sent ahead of their listeners to wait with. On an H200 at 128 streams this took the
first chunk's call from 64 to 31 ms and TTFA p95 from 316 to 274 ms. Not the second chunk too, though it
is due while its listener has only the first: a stream's first two chunks are in most calls, so capping
them took 43% more calls for the same windows, and 128 streams fell behind (5% stall-free; both in
docs/benchmarks.md, fifth sweep).

**Urgent calls** (`urgent_seconds`, `--urgent-seconds`; off by default): a call whose most urgent chunk is due within
that many seconds takes only chunks due that soon, and the chunks with more time wait for the next call. Under load a
stream's second chunk, due 320 ms after its first audio, otherwise rides in a call of the playing streams' later
chunks, which the llm makes ~5x faster than real time and which have seconds to spare. Measured on an H200
(docs/benchmarks.md, 2026-12-02), 0.4 s took the second chunk's time in the vocoder from 187 to 86-110 ms at the
median, and the admission limit no longer fell on it. But the calls hold fewer windows, so the vocoder makes less
audio a second: 149-164x real time against 198x while Poisson 30 turns a second were offered. The later chunks wait,
and turns last longer. Alone it admitted fewer turns. With a faster-growing limit and 256 history slots it admitted
more of a burst, out of the listeners' buffers; over a minute of overload it admitted 5-11% fewer than the
defaults and stalled more of the later chunks.

**The first-chunk lane** (`Lanes`, `--first-chunk-lane on`): first chunks go to a second worker with a
vocoder of their own (`TokenVocoder.lane`: the same models and stream history, its own graphs and a CUDA stream of
high priority), which runs their small calls while the first worker runs a large call of the playing streams. A
first chunk then waits for neither, and the playing streams' calls need no cap for its sake. A stream's jobs still
run one at a time, its first on one lane and the rest on the other. Off in the vocoder, on where `moss-serve up` runs
the stack on a GPU (it admits by headroom there). Under count admission on an H100 with the codec's decoder it took
TTFA p95 at 128 streams from ~460 to ~400-450 ms, but the playing streams' early chunks, now in larger calls and
beside the lane's, stalled more (48 streams 97% → 60% stall-free; docs/benchmarks.md). Under headroom
admission, which stops admitting before streams stall, first chunks waited 63 ms for a call instead of 79 and the
limit admitted 14-27% more turns, all stall-free. Why one worker on the lane: with two (graphs and a CUDA
stream each, a first chunk to the idle one) a first chunk's mean wait for a call fell from ~21 to ~10 ms at Poisson 30
turns a second, but the slowest tenth still waited ~50 ms (both in calls, each slower beside the other) and the
playing streams' slack shrank, so the rule admitted 18-21% fewer (an H100 and an H200; docs/benchmarks.md).
Nor the flow's solve on the lane (codec/solve.py: a first chunk joining the lane's running solve at the next Euler
step, at 0648f5c): the wait went (the slowest tenth's 50-65 → ~8 ms) but a first chunk's own solve took ~20 ms longer
than a call (ticks of ~6 ms beside the llm, other first chunks' admissions and generator calls between them), and in
three pairs the rule admitted -3.5%, +3% and +2% (+7%, -2% on the ramp), one run 98.9% stall-free (2026-11-28).
Nor a stream's second chunk on the lane, though its listener waits for it with the first chunk's 320 ms of audio
only, and under load the admission limit falls on its slack and no other chunk's: ordered by deadline with the first
chunks, its median slack rose (136 → 200 ms at Poisson 30 on an H200) but its tail fell below zero behind the first
chunks of the streams starting with it, first audio came later, and fewer turns were admitted, 82-99% stall-free
(2026-12-01; on an H100 without the deadline order, 2026-11-27, likewise).

Why one worker for the playing streams, not several: a flow call is mostly a fixed cost (~26 ms alone on an H100 at
the real size, +1.5 ms a window), and two calls side by side on two CUDA streams overlap only partly, so one call of
both is faster than two of half; at the real size a second playing worker admitted 44% fewer streams. A call's two
passes can overlap across calls, though: pipelined_worker.py runs each call's generator beside the next call's flow
(`--generator-overlap on`, opt-in).

No asyncio here: `submit` returns a concurrent future; the servicer wraps it (asyncio.wrap_future), so
the gRPC event loop never blocks on the model.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.common.device import PROBE_SECONDS
from services.common.errors import DeviceLost
from services.common.job_thread import JobThread

if TYPE_CHECKING:  # (not imported: it pulls in torch, and `moss-serve` reads DEFAULT_MAX_BATCH from here)
    import numpy as np

    from services.vocoder.streamer import MelStreamer

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Job:
    streamer: MelStreamer
    tokens: list[int] | None           # None: the end of the stream
    audio_started: float | None        # when the stream's first samples went out (None: not yet)
    audio_sent: float                  # seconds of audio sent so far
    submitted: float = field(default_factory=time.perf_counter)
    future: Future = field(default_factory=Future)

    def slack(self, now: float) -> float:
        """Seconds until the stream's listener runs out of audio (first chunks: -inf, they never wait)."""
        return float("-inf") if self.audio_started is None else self.audio_started + self.audio_sent - now

    def deadline(self, first_chunk_budget: float) -> float:
        """When the samples are due (perf_counter seconds): a first chunk's budget after it came in, or
        when the stream's listener runs out of audio."""
        return self.submitted + first_chunk_budget if self.audio_started is None else self.audio_started + self.audio_sent


@dataclass
class Done:
    samples: np.ndarray
    queue_seconds: float    # submitted → its batch started
    compute_seconds: float  # its batch's duration
    batch_size: int


# What one model call may hold: windows, mel frames in all, and mel frames when it carries a first chunk (0:
# max_batch_frames alone: ~3 first windows with room for some urgent ones). A chunk that turns urgent during a call
# waits for all of it, and a first chunk's call is time to first audio; larger calls vocode more per second. Each
# decoder has its own best trade (docs/benchmarks.md); `--max-batch`, `--max-batch-frames` and
# `--first-chunk-batch-frames` override it.
@dataclass(frozen=True)
class CallLimits:
    max_batch: int
    max_batch_frames: int
    first_chunk_batch_frames: int


# The stand-in decoder and BigVGAN: larger calls gain little (an H200 vocodes 361x real time in calls of 8 windows of
# 80 frames, 397x in calls of 64), but at 128 streams calls of up to 64 windows took 145 ms on average and first
# chunks waited 350 ms. 1024 frames is ~25 ms of an H200 alone. The first-chunk cap took that call from 64 to 31 ms
# and TTFA p95 from 316 to 274 ms (H200, 128 streams).
STAND_IN_LIMITS = CallLimits(max_batch=16, max_batch_frames=1024, first_chunk_batch_frames=256)
# The codec's flow costs more per call and less per window (~25 ms a call, ~2.2 ms a window on an H100): with the
# stand-in's limits (6 windows a call) the vocoder falls behind past 80 streams; with these, 128 streams started over
# 6 s play 100% stall-free at TTFA p95 270-282 ms on an H100 (768 first-chunk frames: 303-309 ms). ~190 listeners
# (~31 arrivals a second) need 768 to keep up: most calls then carry a first chunk (docs/benchmarks.md).
FLOW_LIMITS = CallLimits(max_batch=32, max_batch_frames=4096, first_chunk_batch_frames=512)
DEFAULT_MAX_BATCH = STAND_IN_LIMITS.max_batch
DEFAULT_MAX_BATCH_FRAMES = STAND_IN_LIMITS.max_batch_frames
DEFAULT_FIRST_CHUNK_BATCH_FRAMES = STAND_IN_LIMITS.first_chunk_batch_frames
# A first chunk's deadline, after it comes in: what the vocoder may add to time to first audio when chunks of
# streams already playing are due sooner. 0: first chunks before any chunk that is not yet late.
DEFAULT_FIRST_CHUNK_BUDGET = 0.1
# First chunks per call of the first-chunk lane: streams start a few at a time; its graphs are captured up to this.
FIRST_CHUNK_LANE_BATCH = 4


class VocoderWorker(JobThread):
    what = "vocoder worker"

    def __init__(self, vocoder, max_batch: int = DEFAULT_MAX_BATCH, max_wait: float = 0.002,
                 on_batch: Callable[[int, float], None] = lambda size, seconds: None,
                 on_decode: Callable[[float], None] = lambda seconds: None,
                 on_generate: Callable[[float], None] = lambda seconds: None,
                 on_nonfinite: Callable[[str, int], None] = lambda stage, samples: None,
                 max_batch_frames: int = DEFAULT_MAX_BATCH_FRAMES, first_chunk_budget: float = DEFAULT_FIRST_CHUNK_BUDGET,
                 first_chunk_batch_frames: int = DEFAULT_FIRST_CHUNK_BATCH_FRAMES,
                 lost: Callable[[], bool] = lambda: False, on_fatal: Callable[[DeviceLost], None] = lambda err: None,
                 probe_seconds: float = PROBE_SECONDS, name: str = "vocoder-worker", gate=None,
                 urgent_seconds: float = 0.0):
        """vocoder: TokenVocoder (its `launch(windows, last, conditions)` queues a batch, `samples` reads it);
        on_batch(size, seconds) per batch, on_decode(seconds) per pass of its token decoder and on_generate(seconds)
        per call of its generator (parts of a batch's seconds: on CUDA their device time); on_nonfinite(stage, samples)
        per window with NaN or inf in its mel ("mel": the token decoder's) or only in its samples ("generator"), the
        samples zeroed (_check_finite).
        A call holds at most max_batch windows and max_batch_frames mel frames (but always one window), and
        at most first_chunk_batch_frames (when > 0) if it carries a first chunk; first_chunk_budget: seconds.
        urgent_seconds (> 0): a call led by a chunk due within that many seconds takes only such chunks.
        lost(): is the device gone? (asked after a failed batch, and after every probe_seconds idle) If so
        every job fails with DeviceLost, the worker stops, and on_fatal(err) tells the server (device.py).
        gate: the capture.DeviceGate its device work goes through (graphs captured while serving); None: none. See
        the module's docstring."""
        super().__init__(name)
        self.vocoder, self.max_batch, self.max_wait, self.on_batch = vocoder, max_batch, max_wait, on_batch
        self.on_decode, self.on_generate, self.on_nonfinite = on_decode, on_generate, on_nonfinite
        self.nonfinite_logged = float("-inf")  # when the last warning of NaN or inf went to the log
        self.max_batch_frames, self.first_chunk_budget = max_batch_frames, first_chunk_budget
        self.first_chunk_batch_frames, self.urgent_seconds = first_chunk_batch_frames, urgent_seconds
        self.lost, self.on_fatal, self.probe_seconds = lost, on_fatal, probe_seconds
        self.gate = gate
        if gate is not None:
            gate.watch(self)
        self.start()

    # ---- the thread ------------------------------------------------------------------------------
    def _take(self) -> list[Job] | None:
        """Wait for work → the next batch, most urgent first ([]: idle for probe_seconds; None: stopping)."""
        with self.cv:
            if not self._await_pending():
                return []
            if self.stopping:
                self._fail_stopped(self.pending)
                return None
            deadline = self.pending[0].submitted + self.max_wait
            while len(self.pending) < self.max_batch and not self.stopping:
                now = time.perf_counter()
                if now >= deadline or min(j.slack(now) for j in self.pending) < self.max_wait:
                    break  # a first chunk (slack -inf) or an urgent one is waiting: go now
                self.cv.wait(deadline - now)
            self.pending.sort(key=lambda j: j.deadline(self.first_chunk_budget))
            taken, frames, cap = 0, 0, self.max_batch_frames
            now = time.perf_counter()
            # (due sooner than urgent_seconds: a prefix of the deadline order, first chunks included, while the
            # first-chunk budget is under urgent_seconds)
            urgent_only = self.urgent_seconds > 0 and self.pending[0].slack(now) < self.urgent_seconds
            for job in self.pending[: self.max_batch]:
                if urgent_only and job.slack(now) >= self.urgent_seconds:
                    break  # an urgent call: the chunks with time to spare wait for the next one
                frames += job.streamer.window_frames(None if job.tokens is None else len(job.tokens))
                if job.audio_started is None and job.tokens is not None and self.first_chunk_batch_frames:
                    cap = min(cap, self.first_chunk_batch_frames)  # a first chunk aboard: a short call
                if taken and frames > cap:
                    break
                taken += 1
            batch, self.pending = self.pending[:taken], self.pending[taken:]
            return batch

    def _await_pending(self) -> bool:
        """(Holding cv) wait for a job or the stop → False once probe_seconds have passed idle."""
        idle_until = time.monotonic() + self.probe_seconds
        while not self.pending and not self.stopping:
            if (left := idle_until - time.monotonic()) <= 0:
                return False
            self.cv.wait(left)
        return True

    @staticmethod
    def _fail_stopped(jobs: list[Job]) -> None:
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(RuntimeError("the vocoder worker has stopped"))

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            if not batch:  # idle: does the device still work? (under MPS, another client's fault reaches it)
                with self._device():
                    lost = self.lost()
                if lost:
                    self._die(DeviceLost("its GPU failed (found while idle); restarting"), [])
                    return
                continue
            # A stream whose caller went away (a cancelled await cancels its future) is dropped here.
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            with self._device():
                try:
                    with self.vocoder.running():  # (its CUDA stream, if it has one of its own)
                        self._run(batch)
                    continue
                except Exception as exc:  # noqa: BLE001  a bug here must not stop the thread every stream waits on
                    log.exception("vocoder: a batch failed")
                    failure, lost = exc, self.lost()
            if lost:
                self._die(DeviceLost(f"its GPU failed ({str(failure).splitlines()[0]}); restarting"), batch)
                return
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(failure)

    def _device(self):
        """The context of its work on the device: through the gate, if it has one (no capture meanwhile)."""
        return self.gate.call() if self.gate is not None else contextlib.nullcontext()

    def _die(self, err: DeviceLost, batch: list[Job]) -> None:
        """The device is lost: every job fails, none is taken any more, and the server is told."""
        log.critical("vocoder: %s: failing every stream and stopping", err)
        with self.cv:
            self.fatal, self.stopping = err, True
            jobs, self.pending = batch + self.pending, []
        self.on_fatal(err)  # the server first: a stream that sees the error finds it already going down
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(err)

    def _decode_tokens(self, batch: list[Job]) -> dict[int, tuple]:
        """The new tokens (or the end) of every stream in the batch through the token decoder in one pass (by id(job)).
        Should that pass fail, each stream decodes its own in prepare(), so a fault stays with its stream."""
        jobs = [job for job in batch if (job.tokens or job.tokens is None) and not job.streamer.ended]
        if not jobs:
            return {}
        try:
            decoded = self.vocoder.mel_chunks([(job.tokens, job.streamer.decoder_state) for job in jobs])
        except Exception:  # noqa: BLE001
            log.exception("vocoder: decoding a batch of chunks failed; decoding stream by stream")
            return {}
        return {id(job): d for job, d in zip(jobs, decoded)}

    def _run(self, batch: list[Job]) -> None:
        """Decode the batch's tokens in one pass, then vocode (below)."""
        started = time.perf_counter()
        decoded = self._decode_tokens(batch)
        self._vocode(batch, decoded, {id(job): started for job in batch}, decoded_here=bool(decoded))

    def _vocode(self, batch: list[Job], decoded: dict[int, tuple], started: dict[int, float],
                decoded_here: bool = False, call_started: float | None = None) -> None:
        """Prepare each stream's window (with its decoded tokens, by id(job)), vocode the due ones in one call, hand
        each stream its samples (_launch, then _deliver)."""
        self._deliver(self._launch(batch, decoded, started, call_started), decoded_here)

    def _launch(self, batch: list[Job], decoded: dict[int, tuple], started: dict[int, float],
                call_started: float | None = None) -> "Vocoding":
        """Prepare each stream's window and queue the due ones' generator call, without waiting for the device.
        started: when each job's work began (id(job)); the batch's seconds count from call_started (default: the
        earliest). A stream's own fault (its tokens, its state) ends that stream alone; a failed model call fails
        the streams of this batch (the caller reports it)."""
        began = call_started if call_started is not None else min(started.values(), default=time.perf_counter())
        jobs, windows = [], []
        for job in batch:
            try:
                windows.append(job.streamer.prepare(job.tokens, decoded.get(id(job))))
                jobs.append(job)
            except Exception as exc:  # noqa: BLE001
                log.exception("vocoder: preparing a chunk failed")
                job.future.set_exception(exc)
        due = [i for i, w in enumerate(windows) if w.mel is not None]
        mels, last = [windows[i].mel for i in due], [windows[i].last for i in due]
        generation = None
        if due:  # HiFT: each window's source position too (streamer.py)
            conditions = [windows[i].conditions for i in due] if self.vocoder.conditioned else None
            generation = self.vocoder.launch(mels, last, conditions)
        return Vocoding(jobs, windows, due, generation, started, began)

    def _deliver(self, v: "Vocoding", decoded_here: bool = False) -> None:
        """A launched call's samples (waits for the device) to their streams. decoded_here: the decode was this call's
        (its device time is observed after the generator's)."""
        wavs = self.vocoder.samples(v.generation) if v.generation is not None else []
        now = time.perf_counter()
        if v.due:
            self.on_batch(len(v.due), now - v.began)
            self.on_generate(v.generation.seconds())
        if decoded_here:  # (read after the generator's call: its samples are on the host, the decode long done)
            self.on_decode(self.vocoder.decode_seconds(v.decode_timing))
        by_index = dict(zip(v.due, wavs))
        mel_finite = dict(zip(v.due, v.generation.mel_finite)) if v.generation is not None else {}
        for i, (job, window) in enumerate(zip(v.jobs, v.windows)):
            samples = job.streamer.commit(window, by_index.get(i))
            self._check_finite(job, window, samples, mel_finite.get(i, True), len(v.due))
            began_job = v.started.get(id(job), v.began)
            job.future.set_result(Done(samples, began_job - job.submitted, now - began_job, len(v.due)))

    def _check_finite(self, job: Job, window, samples: np.ndarray, mel_finite: bool, calls_windows: int) -> None:
        """NaN or inf in a window's mel or samples: its samples zeroed (a listener hears a gap, not a full-scale click),
        counted, and logged (at most once a NONFINITE_LOG_SECONDS), with what locates it."""
        zeroed = job.streamer.zero_nonfinite(samples)
        if not zeroed and mel_finite:
            return
        stage = "generator" if mel_finite else "mel"
        self.on_nonfinite(stage, zeroed)
        now = time.perf_counter()
        if now - self.nonfinite_logged >= NONFINITE_LOG_SECONDS:
            self.nonfinite_logged = now
            log.warning("%s: NaN or inf in the %s (a window of mel frames [%d, %d), its stream's %s chunk, %d tokens in; "
                        "a call of %d windows): %d of its %d samples sent as silence (vocoder_nonfinite_windows_total "
                        "counts every such window)", self.thread.name,
                        "token decoder's mel" if stage == "mel" else "generator's samples", window.start,
                        window.start + window.mel.shape[1], "first" if job.audio_started is None else "next",
                        job.streamer.tokens, calls_windows, zeroed, len(samples))


NONFINITE_LOG_SECONDS = 10.0  # the least time between two warnings of NaN or inf (each is counted)


@dataclass
class Vocoding:
    """A generator call launched for a batch of jobs (worker._launch): their windows, which were due, the call."""

    jobs: list[Job]
    windows: list
    due: list[int]
    generation: object | None   # runner.Generation (None: no window was due)
    started: dict[int, float]
    began: float
    decode_timing: object = None  # its token decoder's pass (TokenVocoder.decode_timing; None: the latest pass)

    def ready(self) -> bool:
        return self.generation is None or self.generation.ready()


class Lanes:
    """Two workers, one submit: a stream's first chunk to `first` (small calls of first chunks only), every other
    job to `playing` (module docstring)."""

    def __init__(self, playing: VocoderWorker, first: VocoderWorker):
        self.playing, self.first = playing, first

    def submit(self, job: Job) -> Future:
        first = job.audio_started is None and job.tokens is not None
        return (self.first if first else self.playing).submit(job)

    def stop(self) -> None:
        self.first.stop()
        self.playing.stop()
