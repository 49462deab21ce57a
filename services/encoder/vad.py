"""Voice activity: Silero VAD (the `silero-vad` package, which ships its weights) run on many speakers together.

Silero reads 16 kHz audio in windows of 512 samples (32 ms), each with the 64 samples before it as context and a
recurrent state [2, 1, 128] carried from window to window, and gives the window's speech probability. The package's
own wrapper keeps one state inside the model (one speaker per model, and a new batch size resets it), so we call its
16 kHz network directly with each speaker's context and state gathered into a batch: a speaker's probabilities are
those of the wrapper fed that speaker alone (tests/test_encoder_vad.py). One CPU call of 64 speakers' windows costs
about what two single windows do, which is what lets one thread listen to every speaker of a service.

`VadWorker` is that thread: speakers hand in their next samples and get one probability per whole window back.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from services.common.job_thread import JobThread

WINDOW = 512    # samples at 16 kHz a probability covers
CONTEXT = 64    # samples before a window the network reads with it
STATE = (2, 128)


def load_network() -> torch.nn.Module:
    """The packaged Silero model's 16 kHz network: forward(x [B, CONTEXT + WINDOW], state [2, B, 128]) →
    (probability [B, 1], state). Importing the package sets torch's thread count to 1 for the whole process: undone."""
    threads = torch.get_num_threads()
    try:
        from silero_vad import load_silero_vad
    finally:
        torch.set_num_threads(threads)
    return load_silero_vad()._model


@dataclass(eq=False)
class VadStream:
    """One speaker's place in the audio: what the next window reads."""

    context: torch.Tensor = field(default_factory=lambda: torch.zeros(CONTEXT))
    state: torch.Tensor = field(default_factory=lambda: torch.zeros(STATE[0], 1, STATE[1]))
    pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # samples short of a window
    windows: int = 0  # windows given a probability so far


@torch.inference_mode()
def speech_probabilities(network: torch.nn.Module, items: list[tuple[VadStream, np.ndarray]]) -> list[list[float]]:
    """Each stream's next samples → the probabilities of the whole windows they complete, in order. One network call a
    round, the k-th new window of every stream that has one in round k."""
    windows = []
    for stream, samples in items:
        audio = np.concatenate([stream.pending, np.asarray(samples, np.float32)])
        whole = len(audio) // WINDOW * WINDOW
        windows.append(torch.from_numpy(audio[:whole].copy()).view(-1, WINDOW))
        stream.pending = audio[whole:]
    probabilities: list[list[float]] = [[] for _ in items]
    for k in range(max((len(w) for w in windows), default=0)):
        rows = [i for i, w in enumerate(windows) if len(w) > k]
        streams = [items[i][0] for i in rows]
        x = torch.stack([torch.cat([s.context, windows[i][k]]) for s, i in zip(streams, rows)])  # [B, CONTEXT + WINDOW]
        out, state = network(x, torch.cat([s.state for s in streams], 1))                         # [B, 1], [2, B, 128]
        for j, (stream, i) in enumerate(zip(streams, rows)):
            stream.context, stream.state = x[j, -CONTEXT:].clone(), state[:, j : j + 1].clone()
            stream.windows += 1
            probabilities[i].append(float(out[j, 0]))
    return probabilities


@dataclass(eq=False)
class VadJob:
    stream: VadStream
    samples: np.ndarray
    future: Future = field(default_factory=Future)


class VadWorker(JobThread):
    """Every speaker's windows on one thread: each call takes every job waiting (one per stream, in order)."""

    what = "voice-activity worker"

    def __init__(self, network: torch.nn.Module | None = None, on_batch=lambda size, seconds: None):
        super().__init__("vad-worker")
        self.network = network if network is not None else load_network()
        self.on_batch = on_batch
        self.start()

    def probabilities(self, stream: VadStream, samples: np.ndarray) -> Future:
        """→ a future of the probabilities of the windows `samples` complete."""
        return self.submit(VadJob(stream, samples))

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.pending and not self.stopping:
                    self.cv.wait()
                if self.stopping:
                    for job in self.pending:
                        if job.future.set_running_or_notify_cancel():
                            job.future.set_exception(RuntimeError("the voice-activity worker has stopped"))
                    return
                batch, left, seen = [], [], set()
                for job in self.pending:
                    (left if id(job.stream) in seen else batch).append(job)
                    seen.add(id(job.stream))
                self.pending = left
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            started = time.perf_counter()
            try:
                results = speech_probabilities(self.network, [(job.stream, job.samples) for job in batch])
            except Exception as exc:  # noqa: BLE001  fail the jobs, keep the thread every speaker waits on
                for job in batch:
                    job.future.set_exception(exc)
                continue
            self.on_batch(len(batch), time.perf_counter() - started)
            for job, result in zip(batch, results):
                job.future.set_result(result)
