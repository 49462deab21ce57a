"""Keeps the services of `moss-serve up` running: one that exits is started again while the others keep
serving (the gateway holds requests for a stage that is restarting: gateway/backends.py).

A service that dies after running well is started again at once: its start is most of what its restart costs (a
vocoder back ~12 s after a kill on an H200; its first second was this wait, once). The wait before the next restart
then doubles with each failure in a row (1 s, 2 s, 4 s, ... up to 30 s), so a service that cannot start does not spin;
it goes back to none once the service has run for a minute. An exit asked for
(`expect_exit`: a drained replica of a rolling restart) is no failure: the service starts again at once.

Where the stack keeps spares (spare.py: processes that have done a service's imports and wait, two per instance), a
restart is a spare's, and the stack makes the next ones once every service it started again serves: a spare's imports
and reads ahead (the codec built on the CPU, the encoder's weights) are seconds of every core, and none of them can
serve before the restart under way is over. (On an H200, with spares made beside the starts of every GPU stage after
a fault, the llm's weights took 5.3-8.7 s; with spares made once those stages serve, 0.2-0.8 s: docs/benchmarks.md,
starts-2026-11-30 and restarts-2026-11-30b.)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
HEALTHY_AFTER = 60.0
# While a service started again does not serve yet, its health is asked this often (a refused connection answers at
# once; a server that is up, within SERVING_TIMEOUT), and no spare is made; after START_GIVE_UP s without serving the
# spares are made anyway (a start that hangs must not leave the next restart without one).
SERVING_CHECK_SECONDS = 0.5
SERVING_TIMEOUT = 0.2
START_GIVE_UP = 120.0


def report(message: str) -> None:
    """One line of what `moss-serve up` does while it runs, timed as the services' own log lines are: a restart's
    steps are tenths of a second apart, and its lines interleave with theirs."""
    print(f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S,%f')[:-3]} moss-serve up: {message}", file=sys.stderr)


@dataclass
class _State:
    started: float
    backoff: float = 0.0  # the wait before its next restart: none after a good run
    restart_at: float | None = None  # set while the service is down and waiting to be started again


class Supervisor:
    def __init__(self, stack, log: Callable[[str], None] = report,
                 first_backoff: float = FIRST_BACKOFF, max_backoff: float = MAX_BACKOFF, healthy_after: float = HEALTHY_AFTER):
        """stack: a started services.stack.Stack (its `procs` and `start`)."""
        self.stack, self.log = stack, log
        self.first_backoff, self.max_backoff, self.healthy_after = first_backoff, max_backoff, healthy_after
        now = time.monotonic()
        self.state = {name: _State(now) for name in stack.procs}
        self.restarts = {name: 0 for name in stack.procs}
        self.expected: set[str] = set()  # services whose next exit was asked for
        self.starting: dict[str, float] = {}  # services started again and not yet seen serving → when started
        self.next_check = 0.0

    def poll(self, now: float | None = None) -> None:
        """Look at every service once: note an exit, start one whose wait is over, forgive one that has
        run long enough. Call it every fraction of a second."""
        now = time.monotonic() if now is None else now
        for name, st in self.state.items():
            proc = self.stack.procs.get(name)
            if st.restart_at is None:
                if proc is not None and proc.poll() is None:
                    if now - st.started >= self.healthy_after:
                        st.backoff = 0.0
                    continue
                how = f"exited with code {proc.returncode}" if proc is not None else "was stopped"
                if name in self.expected:
                    st.restart_at = now
                    self.log(f"{name} {how}, as asked; starting it again")
                else:
                    st.restart_at = now + st.backoff
                    self.log(f"{name} {how}; starting it again " + (f"in {st.backoff:.0f} s" if st.backoff else "at once"))
            elif now >= st.restart_at:
                if self.stack.start(name):
                    self.log(f"{name} started again from its spare (its imports done ahead)")
                self.restarts[name] += 1
                st.started, st.restart_at = now, None
                self.starting[name] = now
                if name in self.expected:
                    self.expected.discard(name)
                else:
                    st.backoff = min(max(st.backoff * 2, self.first_backoff), self.max_backoff)
        if self.stack.spare_services and not self.still_starting(now):
            self.stack.keep_spares()

    def still_starting(self, now: float) -> bool:
        """Whether a service started again does not serve yet (asked at most every SERVING_CHECK_SECONDS)."""
        if self.starting and now >= self.next_check:
            self.next_check = now + SERVING_CHECK_SECONDS
            for name, started in list(self.starting.items()):
                proc = self.stack.procs.get(name)
                if (now - started > START_GIVE_UP or proc is None or proc.poll() is not None
                        or self.stack.serving(name, timeout=SERVING_TIMEOUT)):
                    del self.starting[name]
        return bool(self.starting)

    def expect_exit(self, name: str) -> None:
        """`name` was asked to exit (drained): start it again as soon as it has, without counting a failure."""
        self.expected.add(name)

    def started(self, name: str, now: float | None = None) -> None:
        """`name` was started again from outside (a new MPS daemon's client): not to be restarted by us now."""
        st = self.state[name]
        st.started, st.restart_at = time.monotonic() if now is None else now, None
