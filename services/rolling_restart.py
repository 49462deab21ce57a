"""`moss-serve up`'s rolling restart (SIGHUP to `up`): the llm and vocoder replicas started again one at a time while
the others serve, for new weights or voices, which a service reads as it starts.

Replica k is its llm and its vocoder (llm-k and vocoder-k: one GPU's under --gpus, and under MPS clients of one
server). Each in turn is drained (SIGUSR2, services/common/server.py): its health says NOT_SERVING, the gateway sends
new turns to the replicas still serving, and the turns already running on it end as they would have. It then exits,
the supervisor starts it again at once (supervisor.py's expect_exit: no failure, no backoff), and the next replica is
drained only once this one serves again and is warm (its vocoder's CUDA graphs all captured, or WARM_TIMEOUT gone
by: on an H200 the next drain, begun while the restarted vocoder still had 190 graphs to capture, left it alone with
the load and calls padded into its largest graphs, and the admission limit fell 48 → 5; docs/benchmarks.md,
spare-2026-11-30). With two replicas or more no admitted turn fails. A Converse session whose
last turn ran on a drained llm goes on from the history the gateway holds, on another replica.

With one replica each stage is down from the end of its drain until it is back (the log says so when the restart
begins). The gateway and the encoder are not restarted: the gateway holds the sessions, and the encoder runs once.
A second SIGHUP during a restart queues one more round after it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from services.common.server import DRAIN_SECONDS
from services.supervisor import report

DRAIN_TIMEOUT = DRAIN_SECONDS + 15.0  # a replica still running by then is stopped (SIGTERM, then SIGKILL)
WARM_CHECK_SECONDS = 1.0
WARM_TIMEOUT = 150.0  # a restarted replica serving but not warm by then: the next is drained anyway (its vocoder took
                      # 60-70 s for its graphs while serving on an H200)


def replica_groups(names: list[str]) -> list[list[str]]:
    """The llm and vocoder processes of each replica, in replica order: [["llm", "vocoder"], ["llm-2", "vocoder-2"]]."""
    from services.stack import REPLICATED, replica_number, service_of

    replicated = [name for name in names if service_of(name) in REPLICATED]
    count = max((replica_number(name) for name in replicated), default=0)
    return [[name for name in replicated if replica_number(name) == k] for k in range(1, count + 1)]


class RollingRestart:
    """Polled by up's loop (`poll`, every POLL_SECONDS of up.py); `request` (from the SIGHUP handler) starts a round."""

    def __init__(self, stack, supervisor, groups: list[list[str]], start_timeout: float,
                 log: Callable[[str], None] = report,
                 drain_timeout: float = DRAIN_TIMEOUT, warm_timeout: float = WARM_TIMEOUT):
        """stack: a started services.stack.Stack (its procs, `serving` and `stop`); supervisor: the one that starts
        what exits (its `expect_exit`)."""
        self.stack, self.supervisor, self.groups, self.log = stack, supervisor, groups, log
        self.start_timeout, self.drain_timeout, self.warm_timeout = start_timeout, drain_timeout, warm_timeout
        self.requested = 0  # rounds asked for and not begun
        self.queue: list[list[str]] = []  # this round's replicas not yet drained
        self.group: list[str] | None = None  # the replica being restarted
        self.phase = ""  # "draining" (asked to exit), "starting" (exited: waiting until it serves again), "warming"
        self.warm_checked = float("-inf")  # when the warming replica's health was last asked
        self.since = 0.0
        self.old: dict = {}  # name → the process that was asked to drain
        self.rounds = 0  # rounds done

    def request(self) -> None:
        self.requested += 1

    @property
    def busy(self) -> bool:
        return self.group is not None or bool(self.queue)

    def poll(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.group is None:
            if not self.queue and self.requested:
                self.requested -= 1
                self.queue = [list(g) for g in self.groups]
                alone = "" if len(self.groups) > 1 else (
                    " (one replica: the llm and the vocoder are down from the end of its drain until it is back)")
                self.log(f"rolling restart: {len(self.groups)} replica(s), one at a time{alone}")
            if self.queue:
                self._drain(self.queue.pop(0), now)
            return
        if self.phase == "draining":
            self._wait_exit(now)
        elif self.phase == "starting":
            self._wait_serving(now)
        else:
            self._wait_warm(now)

    def _drain(self, group: list[str], now: float) -> None:
        self.group, self.phase, self.since = group, "draining", now
        self.old = {name: self.stack.procs.get(name) for name in group}
        for name in group:
            self.supervisor.expect_exit(name)
            proc = self.old[name]
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGUSR2)
        self.log(f"rolling restart: draining {', '.join(group)} (its running turns end there; new ones go elsewhere)")

    def _wait_exit(self, now: float) -> None:
        running = [name for name, proc in self.old.items()
                   if proc is not None and proc.poll() is None and self.stack.procs.get(name) is proc]
        if running and now - self.since > self.drain_timeout:
            self.log(f"rolling restart: {', '.join(running)} still running {self.drain_timeout:.0f} s after its drain "
                     f"began; stopping it")
            self.stack.stop(*running)
            running = []
        if not running:
            self.phase, self.since = "starting", now

    def _wait_serving(self, now: float) -> None:
        group = self.group
        back = all((proc := self.stack.procs.get(name)) is not None and proc is not self.old[name]
                   and proc.poll() is None and self.stack.serving(name) for name in group)
        if back:
            self.log(f"rolling restart: {', '.join(group)} serving again")
            self.phase, self.since, self.warm_checked = "warming", now, float("-inf")
            self._wait_warm(now)
        elif now - self.since > self.start_timeout:
            self.log(f"rolling restart: {', '.join(group)} not serving {self.start_timeout:.0f} s after it stopped; "
                     f"the restart ends here (the supervisor goes on starting it)")
            self.queue = []
            self._next(back=False)

    def _wait_warm(self, now: float) -> None:
        if now - self.since < self.warm_timeout and now - self.warm_checked < WARM_CHECK_SECONDS:
            return  # (a health check each poll would open ten channels a second for up to WARM_TIMEOUT)
        self.warm_checked = now
        if all(self.stack.warm(name) for name in self.group):
            self.log(f"rolling restart: {', '.join(self.group)} warm after {now - self.since:.0f} s")
        elif now - self.since > self.warm_timeout:
            self.log(f"rolling restart: {', '.join(self.group)} not warm {self.warm_timeout:.0f} s after it served; "
                     f"going on")
        else:
            return
        self._next(back=True)

    def _next(self, back: bool) -> None:
        self.group = None
        if not self.queue:
            self.rounds += 1
            self.log("rolling restart: done" if back else "rolling restart: stopped")
