"""`moss-serve up` keeps its services: one that dies is started again with backoff while the others keep
serving, and none outlives `up`, even when `up` is killed with SIGKILL."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.stack import Ports, is_serving
from services.supervisor import Supervisor


class FakeProc:
    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


class FakeStack:
    spare_services = frozenset()  # (keeps no spares)

    def __init__(self, names):
        self.procs = {n: FakeProc() for n in names}
        self.started = []

    def start(self, name):
        self.procs[name] = FakeProc()
        self.started.append(name)


def test_a_first_death_restarts_at_once_then_the_wait_doubles_and_resets_once_it_runs():
    stack, lines = FakeStack(["llm", "vocoder"]), []
    sup = Supervisor(stack, log=lines.append, first_backoff=1, max_backoff=4, healthy_after=60)
    t = time.monotonic()
    waits = []
    for _ in range(4):  # llm dies at once, four times in a row
        stack.procs["llm"].returncode = 1
        sup.poll(t)
        restart_at = sup.state["llm"].restart_at
        waits.append(restart_at - t)
        sup.poll(restart_at - 0.01)
        assert stack.started.count("llm") == len(waits) - 1  # not before its wait is over
        t = restart_at
        sup.poll(t)
    assert waits == [0, 1, 2, 4]  # at once, then doubling, capped
    assert stack.started == ["llm"] * 4 and sup.restarts == {"llm": 4, "vocoder": 0}  # the vocoder untouched
    assert "llm exited with code 1; starting it again at once" in lines[0]
    assert "llm exited with code 1; starting it again in 4 s" in lines[-1]
    sup.poll(t + 61)  # ran for a minute: forgiven
    stack.procs["llm"].returncode = -9
    sup.poll(t + 62)
    assert sup.state["llm"].restart_at - (t + 62) == 0


class SparedStack(FakeStack):
    """A stack that keeps spares: it counts the calls that make them, and says what `up` asks of health."""
    spare_services = frozenset({"llm", "vocoder"})

    def __init__(self, names):
        super().__init__(names)
        self.kept, self.asked, self.up = 0, [], set()

    def keep_spares(self):
        self.kept += 1

    def serving(self, name, timeout=1.0):
        self.asked.append(name)
        return name in self.up


def test_spares_are_made_again_only_once_every_restarted_service_serves():
    """A spare's imports and reads ahead take every core for seconds: made beside the starts after a fault they slow
    them, so they wait until those starts serve (or give up on one that never does)."""
    from services.supervisor import SERVING_CHECK_SECONDS, START_GIVE_UP

    stack = SparedStack(["llm", "vocoder"])
    sup = Supervisor(stack, log=lambda _: None)
    t = time.monotonic()
    sup.poll(t)
    assert stack.kept == 1  # a stack that serves keeps its spares
    stack.procs["llm"].returncode = stack.procs["vocoder"].returncode = 3
    sup.poll(t + 1)  # both seen dead (and nothing started yet: spares may still be made)
    kept = stack.kept
    sup.poll(t + 1.1)  # both started again
    assert stack.started == ["llm", "vocoder"]
    for k in range(2, 10):
        sup.poll(t + 1.1 + k * 0.1)  # polled every 0.1 s; health asked every SERVING_CHECK_SECONDS
    assert stack.kept == kept and 2 <= len(stack.asked) <= 2 * (0.9 / SERVING_CHECK_SECONDS + 1)
    stack.up.add("llm")
    sup.poll(t + 3)
    assert stack.kept == kept  # the vocoder still starts
    stack.up.add("vocoder")
    sup.poll(t + 4)
    assert stack.kept == kept + 1  # every restarted one serves: spares again
    asked = len(stack.asked)
    sup.poll(t + 5)
    assert stack.kept == kept + 2 and len(stack.asked) == asked  # no health asked of a stack that serves

    stack.up.clear()
    stack.procs["llm"].returncode = 1
    sup.poll(t + 100)
    sup.poll(t + 102)  # started again after its wait; it never serves
    kept = stack.kept
    sup.poll(t + 103)
    assert stack.kept == kept
    sup.poll(t + 102 + START_GIVE_UP + 1)
    assert stack.kept == kept + 1  # given up on: the next restart gets its spare


def service_processes(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of each `services.cli <service> ...` process whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0")]
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and "services.cli" in argv:
            found.append((int(entry.name), argv))
    return found


def children(pid: int) -> dict[str, int]:
    """service name → pid of the `services.cli <service>` processes whose parent is `pid` (one of each)."""
    return {argv[argv.index("services.cli") + 1]: child for child, argv in service_processes(pid)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def say(target: str) -> int:
    request = gateway_pb2.SynthesizeRequest(text="hello", sampling=common_pb2.SamplingParams(max_new_tokens=6, seed=1))
    with grpc.insecure_channel(target) as channel:
        return list(gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=60))[-1].summary.num_samples


def test_up_restarts_a_dead_service_and_its_services_die_with_it(tmp_path):
    ports = Ports.free()
    flags = []
    for service in ("gateway", "llm", "vocoder"):
        flags += [f"--{service}-port", str(ports.grpc[service]), f"--{service}-metrics-port", str(ports.metrics[service])]
    flags += ["--http-port", "0", "--no-encoder"]  # (supervision is the same for every service: three say it)
    # Its log (and its services', which share its stderr) to a file: a pipe nobody reads fills up and stops them all.
    up = subprocess.Popen([sys.executable, "-m", "services.cli", "up", *flags], stderr=open(tmp_path / "up.log", "w"))
    gateway = f"127.0.0.1:{ports.grpc['gateway']}"
    try:
        deadline = time.monotonic() + 120
        # Serving, and up done starting (its supervision begins then: an llm killed before that waits for up's
        # start to end).
        while not is_serving(gateway) or "Ctrl-C stops" not in (tmp_path / "up.log").read_text():
            assert up.poll() is None and time.monotonic() < deadline, "moss-serve up did not come up"
            time.sleep(0.3)
        first = children(up.pid)
        assert set(first) == {"gateway", "llm", "vocoder"}, first

        os.kill(first["llm"], signal.SIGKILL)  # the llm dies: up starts it again, the others stay
        deadline = time.monotonic() + 10
        while is_serving(gateway):  # the gateway's watcher sees it within a second
            assert time.monotonic() < deadline, "the gateway still reports SERVING without its llm"
            time.sleep(0.1)
        assert say(gateway) > 0  # the gateway holds the request until the new llm is ready
        second = children(up.pid)
        assert second["llm"] != first["llm"]
        assert (second["gateway"], second["vocoder"]) == (first["gateway"], first["vocoder"])

        os.kill(up.pid, signal.SIGKILL)  # no chance to clean up: the services must still go
        up.wait(10)
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in second.values()):
            assert time.monotonic() < deadline, f"services outlived moss-serve up: {children(1) or second}"
            time.sleep(0.2)
        assert not is_serving(gateway, timeout=0.5)
    finally:
        if up.poll() is None:
            up.kill()
        for pid in children(up.pid).values():
            os.kill(pid, signal.SIGKILL)
