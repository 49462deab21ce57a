"""A thread that owns a device and runs the jobs other threads hand it (the vocoder's and the encoder's workers).

Jobs go in through `submit` (from any thread, e.g. the gRPC event loop's) and wait in `pending` under `cv` until
the subclass's `_loop`, on the thread, takes them in batches. `stop` ends it; a stopped thread refuses new jobs
with `fatal` (why it stopped, e.g. its device lost) or a plain error.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future


class JobThread:
    what = "worker"  # for the errors: "the <what> has stopped"

    def __init__(self, name: str):
        """Subclasses set their own fields, then `start()`."""
        self.pending: list = []
        self.cv = threading.Condition()
        self.stopping = False
        self.fatal: Exception | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job) -> Future:
        """Queue a job (with a `future`) → its future."""
        with self.cv:
            if self.stopping:
                raise self.fatal or RuntimeError(f"the {self.what} has stopped")
            self.pending.append(job)
            self.cv.notify()
        return job.future

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout=10)

    def _loop(self) -> None:  # pragma: no cover (every subclass has its own)
        raise NotImplementedError
