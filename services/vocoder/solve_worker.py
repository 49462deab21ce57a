"""The vocoder's worker with the flow's solve batched at the Euler step (codec/solve.py): a stream's block joins the
running solve at the next tick, instead of waiting for the flow call in flight and then riding a call of its own.

Each turn of the loop:
- the jobs that came in are opened: a chunk's tokens join its stream's decoder state, and its first row (decoder.py's
  `next_row`) waits to be admitted; a chunk with nothing due goes straight to the generator, and a stream that holds
  no history slot (more streams than `--flow-history-streams`) is decoded over its window in one call, as worker.py
  does;
- the waiting rows are admitted together (earliest deadline first, as many as the solve has room for) when one of
  them is urgent (a stream's first chunk, a chunk due within `urgent_slack` seconds, or the next row of a chunk
  already begun), when nothing is in flight, or every `admit_every` ticks: an admission costs about a tick (the
  encoder of its rows; H100: ~4 ms), so the playing streams' chunks, due seconds later, join a few at a time;
- one tick (an Euler step of every row in flight);
- the chunks ready (finished by a tick, or with nothing to solve) go to the generator in one call, and their samples to
  their streams: at once if one of them is urgent, or else once the oldest has waited `generate_wait` seconds, so that
  the playing streams' windows of several admissions share a call.

**Measured, and off by default** (`--flow-solve off`; docs/benchmarks.md): on an H100 at 128 streams beside
the llm (MPS), the solve's turns are bound by the device (a tick of ~17-32 rows 6-8.5 ms there, ~21 ms of wall per turn
with the admissions and HiFT calls between ticks), so a first block's 10 ticks take longer than the call it would have
waited for: vocoder first chunk 160-257 ms and 97.5% stall-free at best, against 89 ms and 99.6% with flow calls.
Measured again on an H200 (2026-11-29, the stack at its defaults otherwise): 108 of 256 on the ramp and 354 of 600 at
Poisson 30, against 141 and 417 with flow calls; a first chunk's vocoder side 127 ms at the median against 72 ms.
Driving the first-chunk lane's first chunks only (2026-11-28, measured and taken out): ticks of ~1.9 rows
took ~6 ms beside the llm, a first chunk's vocoder side the same on average as the lane's calls with their wait, and the
admission rule let in as many turns (worker.py's lane paragraph).

A chunk stays cancellable while it is in the solve (its future is set running only once its samples are made): a
cancelled chunk's row is dropped at the next turn, and its stream's slot is freed once the device is past it
(history.py). A failed tick fails the chunks in flight, and a lost device stops the worker as worker.py's does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.errors import DeviceLost
from services.vocoder.worker import Job, VocoderWorker

log = logging.getLogger(__name__)

DEFAULT_SOLVE_ROWS = 32     # rows in flight at most (at 128 streams 64 made ticks slower and left the table as full)
DEFAULT_ADMIT_EVERY = 5     # ticks between admissions of chunks that are not urgent (divides the 10 Euler steps)
DEFAULT_URGENT_SLACK = 0.3  # seconds: a playing stream's chunk due sooner is admitted at once (a solve: ~10 ticks)
# Seconds a chunk that is not urgent may wait, solved, for a generator call to share: a call costs ~12 ms beside the
# llm (H100, 8 HiFT windows), and one per admission group was ~19 a second at 128 streams.
DEFAULT_GENERATE_WAIT = 0.1


@dataclass(eq=False)
class Chunk:
    """A job whose rows go through the solve: its decoder state, the row waiting or in flight (state, plan), the mel
    of its rows solved so far, and when its first row joined the solve."""

    job: Job
    state: object
    final: bool
    row: tuple
    pieces: list = field(default_factory=list)
    admitted: float | None = None

    def urgent(self, now: float, slack: float) -> bool:
        return self.job.audio_started is None or self.job.slack(now) < slack or bool(self.pieces)


class SolveWorker(VocoderWorker):
    def __init__(self, vocoder, solve, admit_every: int = DEFAULT_ADMIT_EVERY,
                 urgent_slack: float = DEFAULT_URGENT_SLACK, generate_wait: float = DEFAULT_GENERATE_WAIT,
                 on_solve: Callable[[str, int, float], None] = lambda kind, rows, seconds: None, **options):
        """vocoder: a TokenVocoder with the flow decoder; solve: its FlowSolve. on_solve(kind, rows, seconds) for each
        admission ("admit") and tick ("tick"), device time on CUDA. options: VocoderWorker's (max_batch and the frame
        caps do not apply: a generator call takes every window ready in a turn)."""
        self.solve, self.admit_every, self.urgent_slack, self.on_solve = solve, admit_every, urgent_slack, on_solve
        self.generate_wait = generate_wait
        self.decoder = vocoder.decoder
        self.waiting: list[Chunk] = []
        self.ready: list[tuple[Job, tuple | None, float, float]] = []  # (job, decoded, started, ready since)
        self.launched: list = []  # generator calls queued on the device (worker.py's Vocoding), oldest first
        self.since_admission = 0
        super().__init__(vocoder, **options)

    # ---- the thread ------------------------------------------------------------------------------
    def _take_new(self) -> list[Job] | None:
        """The jobs that came in; waits for one only while the solve has nothing in flight or waiting ([] after
        probe_seconds idle; None: stopping, every job failed)."""
        with self.cv:
            if not self._busy() and not self._await_pending():
                return []
            if self.stopping:
                self._fail_stopped(self.pending + self._held())
                return None
            jobs, self.pending = self.pending, []
            return jobs

    def _held(self) -> list[Job]:
        """The jobs whose rows wait for the solve or fly in it."""
        return ([c.job for c in self.waiting] + [r.tag.job for r in self.solve.flight] + [r[0] for r in self.ready]
                + [job for v in self.launched for job in v.jobs])

    def _loop(self) -> None:
        while (jobs := self._take_new()) is not None:
            if not jobs and not self._busy():  # idle: does the device still work?
                if self.lost():
                    self._die(DeviceLost("its GPU failed (found while idle); restarting"), [])
                    return
                continue
            try:
                with self.vocoder.running():
                    self._turn([job for job in jobs if not job.future.cancelled()])
            except Exception as exc:  # noqa: BLE001  a bug here must not stop the thread every stream waits on
                log.exception("vocoder: the flow's solve failed")
                failed = jobs + self._held()
                self.waiting, self.ready, self.launched = [], [], []
                for row in list(self.solve.flight):
                    self.solve.drop(row.tag)
                if self.lost():
                    self._die(DeviceLost(f"its GPU failed ({str(exc).splitlines()[0]}); restarting"), failed)
                    return
                for job in failed:
                    if not job.future.done():
                        job.future.set_exception(exc)

    def _turn(self, jobs: list[Job]) -> None:
        now = time.perf_counter()
        ready: list[tuple[Job, tuple | None, float]] = []   # (job, its decoded tokens (mel, state) or None, started)
        over_window = []
        for job in jobs:
            try:
                way, decoded = self._open(job)
            except Exception as exc:  # noqa: BLE001  its own fault: this stream alone
                log.exception("vocoder: opening a chunk failed")
                job.future.set_exception(exc)
                continue
            if way == "window":
                over_window.append(job)
            elif way == "ready":
                ready.append((job, decoded, now))
        if over_window:
            decoded = self._decode_tokens(over_window)
            ready += [(job, decoded.get(id(job)), now) for job in over_window]
        self._drop_cancelled()
        self.ready = [r for r in self.ready if not r[0].future.cancelled()]
        if self._admission_due(now):
            self._admit(now)
        self.ready += [(job, decoded, started, float("-inf")) for job, decoded, started in ready]  # (never wait)
        self.ready += [(job, decoded, started, now) for job, decoded, started in self._tick()]
        for kind, rows, seconds in self.solve.times():
            self.on_solve(kind, rows, seconds)
        if self._generation_due(now):
            ready, self.ready = [r[:3] for r in self.ready], []
            self._generate(ready)
        self._deliver_ready()

    def _generation_due(self, now: float) -> bool:
        """Whether the ready chunks go to the generator now: nothing else in the solve, one of them urgent (a first
        chunk, one due within urgent_slack, one that was never solved), or the oldest solved `generate_wait` ago."""
        if not self.ready:
            return False
        if not (self.solve.flight or self.waiting) or now - min(r[3] for r in self.ready) >= self.generate_wait:
            return True
        return any(job.audio_started is None or job.slack(now) < self.urgent_slack for job, *_ in self.ready)

    def _open(self, job: Job) -> tuple[str, tuple | None]:
        """A job's chunk → ("solve", None): its first row waits for admission; ("window", None): its stream holds no
        history slot, so it is decoded over its window in a call; ("ready", (mel, state)): nothing is due (or None:
        its stream has ended, and prepare() says so)."""
        streamer = job.streamer
        if streamer.ended:
            return "ready", None
        state = self.decoder.extend(streamer.decoder_state, job.tokens)
        final = job.tokens is None
        row = self.decoder.next_row(state, final)
        if row is None:
            return "ready", self.decoder.finish(state, [], final)
        state, plan, in_history = row
        if not in_history:
            return "window", None
        self.waiting.append(Chunk(job, state, final, (state, plan)))
        return "solve", None

    def _drop_cancelled(self) -> None:
        """Cancelled chunks leave: waiting rows at once, rows in flight from the solve."""
        self.waiting = [c for c in self.waiting if not c.job.future.cancelled()]
        for row in [r for r in self.solve.flight if r.tag.job.future.cancelled()]:
            self.solve.drop(row.tag)

    def _admission_due(self, now: float) -> bool:
        if not self.waiting or not self.solve.room:
            return False
        return (not self.solve.flight or self.since_admission >= self.admit_every
                or any(c.urgent(now, self.urgent_slack) for c in self.waiting))

    def _admit(self, now: float) -> None:
        self.waiting.sort(key=lambda c: c.job.deadline(self.first_chunk_budget))
        taken, self.waiting = self.waiting[: self.solve.room], self.waiting[self.solve.room :]
        self.solve.admit([c.row for c in taken], taken)
        for c in taken:
            c.admitted = c.admitted or now
        self.since_admission = 0

    def _tick(self) -> list[tuple[Job, tuple, float]]:
        """One tick → the chunks it finished, each (job, (mel, state), when its first row was admitted); a chunk with
        more due waits for admission again."""
        if not self.solve.flight:
            return []
        finished = []
        solved = self.solve.tick()
        self.since_admission += 1
        for chunk, mel in solved:
            state, plan = chunk.row
            chunk.pieces.append(mel)
            chunk.state = self.decoder.advance(state, plan)
            row = self.decoder.next_row(chunk.state, chunk.final)
            if row is not None and row[2]:            # more than one row holds: its next one, at the next admission
                chunk.state, plan, _ = row
                chunk.row = (chunk.state, plan)
                self.waiting.append(chunk)
                continue
            if row is not None:                       # its slot let go (a cancel) with more due: over its window
                if chunk.job.future.cancelled():
                    continue
                mel, chunk.state = self.decoder.decode_chunks([(None if chunk.final else [], chunk.state)])[0]
                chunk.pieces.append(mel)
            finished.append((chunk.job, self.decoder.finish(chunk.state, chunk.pieces, chunk.final), chunk.admitted))
        return finished

    def _generate(self, ready: list[tuple[Job, tuple | None, float]]) -> None:
        """The ready chunks' windows through the generator in one call, queued on the device (worker.py's _launch):
        the next ticks are queued behind it at once, and its samples go out once the device has made them
        (_deliver_ready). The cancelled are let go."""
        ready = [r for r in ready if r[0].future.set_running_or_notify_cancel()]
        decoded = {id(job): d for job, d, _ in ready if d is not None}
        self.launched.append(self._launch([job for job, _, _ in ready], decoded,
                                          {id(job): started for job, _, started in ready},
                                          call_started=time.perf_counter()))

    def _deliver_ready(self) -> None:
        """The launched calls whose samples are in go to their streams, oldest first; all of them, waiting for the
        device, when nothing else is left to do."""
        wait = not (self.solve.flight or self.waiting or self.ready)
        while self.launched and (wait or self.launched[0].ready()):
            self._deliver(self.launched.pop(0))

    def _busy(self) -> bool:
        return bool(self.solve.flight or self.waiting or self.ready or self.launched)
