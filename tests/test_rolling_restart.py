"""`moss-serve up`'s rolling restart (SIGHUP): the replicas drained and started again one at a time while the others
serve. Under a steady load no admitted turn fails, the gateway keeps its process, and a session opened before goes on
from its history as it would have; the steps themselves (rolling_restart.py) with stand-in processes."""

from __future__ import annotations

import asyncio
import signal
import threading

import grpc
from conftest import UpProcess, metric_value, scrape
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from test_supervisor import service_processes
from test_up import spaced_free_ports

from services.gateway.client import converse
from services.rolling_restart import RollingRestart, replica_groups
from services.supervisor import Supervisor

GREEDY = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=12, min_new_tokens=12)
LOAD = common_pb2.SamplingParams(max_new_tokens=16, min_new_tokens=16, seed=2)


# ---- the steps, with stand-in processes -------------------------------------------------------------------------------

class FakeProc:
    def __init__(self):
        self.returncode, self.signals = None, []

    def poll(self):
        return self.returncode

    def send_signal(self, sig):
        self.signals.append(sig)


class FakeStack:
    spare_services = frozenset()  # (keeps no spares)

    def __init__(self, names):
        self.procs = {name: FakeProc() for name in names}
        self.up: set[str] = set(names)  # serving
        self.cold: set[str] = set()  # serving, still preparing (a vocoder capturing graphs)
        self.stopped = []

    def start(self, name):
        self.procs[name] = FakeProc()

    def serving(self, name):
        return name in self.up

    def warm(self, name):
        return name in self.up and name not in self.cold

    def stop(self, *names):
        self.stopped += names
        for name in names:
            self.procs.pop(name).returncode = -15


NAMES = ["llm", "llm-2", "vocoder", "vocoder-2", "encoder", "gateway"]


def test_replicas_are_the_llm_and_vocoder_of_each_number():
    assert replica_groups(NAMES) == [["llm", "vocoder"], ["llm-2", "vocoder-2"]]
    assert replica_groups(["llm", "vocoder", "gateway"]) == [["llm", "vocoder"]]


def test_one_replica_drains_at_a_time_and_the_next_waits_until_it_serves_again():
    stack, said = FakeStack(NAMES), []
    supervisor = Supervisor(stack, log=said.append)
    rolling = RollingRestart(stack, supervisor, replica_groups(NAMES), start_timeout=60, log=said.append)
    first = dict(stack.procs)
    rolling.request()
    rolling.poll(now=0)
    assert first["llm"].signals == [signal.SIGUSR2] and first["vocoder"].signals == [signal.SIGUSR2]
    assert first["llm-2"].signals == [] and first["vocoder-2"].signals == []

    first["llm"].returncode = first["vocoder"].returncode = 0  # drained
    stack.up -= {"llm", "vocoder"}
    supervisor.poll(now=1)  # noted: started again at once, no failure counted
    supervisor.poll(now=1)
    assert stack.procs["llm"] is not first["llm"] and supervisor.restarts["llm"] == 1
    assert supervisor.state["llm"].backoff == 0  # no failure counted: a death now would restart it at once
    rolling.poll(now=1)
    rolling.poll(now=2)  # started, not serving yet: the second replica waits
    assert first["llm-2"].signals == []
    stack.up |= {"llm", "vocoder"}
    rolling.poll(now=3)
    rolling.poll(now=3)
    assert first["llm-2"].signals == [signal.SIGUSR2] and first["vocoder-2"].signals == [signal.SIGUSR2]

    first["llm-2"].returncode = first["vocoder-2"].returncode = 0
    supervisor.poll(now=4)
    supervisor.poll(now=4)
    rolling.poll(now=4)
    rolling.poll(now=5)
    assert rolling.rounds == 1 and not rolling.busy
    assert "rolling restart: done" in said
    assert all(p.signals == [] for name, p in stack.procs.items())  # the new ones left alone
    assert [n for n in ("encoder", "gateway") if stack.procs[n] is not first[n]] == []


def test_a_replica_that_does_not_drain_in_time_is_stopped_and_one_that_does_not_come_back_ends_the_round():
    stack, said = FakeStack(NAMES), []
    supervisor = Supervisor(stack, log=said.append)
    rolling = RollingRestart(stack, supervisor, replica_groups(NAMES), start_timeout=30, log=said.append,
                             drain_timeout=10)
    rolling.request()
    rolling.poll(now=0)
    rolling.poll(now=5)
    assert stack.stopped == []
    rolling.poll(now=11)
    assert stack.stopped == ["llm", "vocoder"]
    supervisor.poll(now=11)
    supervisor.poll(now=11)
    stack.up -= {"llm", "vocoder"}  # started again, never serving
    rolling.poll(now=12)
    rolling.poll(now=50)
    assert not rolling.busy and rolling.rounds == 1 and "rolling restart: stopped" in said
    assert not stack.procs["llm-2"].signals  # the second replica was never drained


def test_the_next_replica_is_drained_only_once_the_restarted_one_is_warm_or_its_wait_is_over():
    stack, said = FakeStack(NAMES), []
    supervisor = Supervisor(stack, log=said.append)
    rolling = RollingRestart(stack, supervisor, replica_groups(NAMES), start_timeout=60, log=said.append,
                             warm_timeout=100)
    first = dict(stack.procs)
    for round_ in range(2):
        rolling.request()
        rolling.poll(now=0)
        old = {name: stack.procs[name] for name in ("llm", "vocoder")}
        for proc in old.values():
            proc.returncode = 0
        supervisor.poll(now=1)
        supervisor.poll(now=1)
        stack.cold.add("vocoder")  # serving, its graphs still being captured
        rolling.poll(now=1)
        rolling.poll(now=2)
        assert "rolling restart: llm, vocoder serving again" in said
        rolling.poll(now=50)
        assert first["llm-2"].signals == [signal.SIGUSR2] * round_  # not drained while the vocoder is cold
        if round_ == 0:
            stack.cold.clear()
            rolling.poll(now=60)
            rolling.poll(now=60)
            assert "rolling restart: llm, vocoder warm after 58 s" in said
        else:
            rolling.poll(now=103)  # never warm: the wait is over
            rolling.poll(now=103)
            assert "rolling restart: llm, vocoder not warm 100 s after it served; going on" in said
        assert first["llm-2"].signals == [signal.SIGUSR2] * (round_ + 1)
        first["llm-2"].returncode = first["vocoder-2"].returncode = 0  # (drained; its new process left serving)
        supervisor.poll(now=104)
        supervisor.poll(now=104)
        stack.cold.clear()
        rolling.poll(now=105)
        rolling.poll(now=106)
        assert rolling.rounds == round_ + 1 and not rolling.busy
        first["llm-2"].returncode = first["vocoder-2"].returncode = None  # (stand-ins: the next round signals them)
        stack.procs["llm-2"], stack.procs["vocoder-2"] = first["llm-2"], first["vocoder-2"]


# ---- the real thing: `moss-serve up --replicas 2` under load ------------------------------------------------------------

def processes(parent: int) -> dict[str, int]:
    """"<service>:<port>" → pid of each service process of `parent` (replicas apart, where children() has one each)."""
    return {f"{argv[argv.index('services.cli') + 1]}:{argv[argv.index('--port') + 1]}": pid
            for pid, argv in service_processes(parent)}


def test_sighup_restarts_every_replica_under_load_and_no_admitted_turn_fails():
    ports = spaced_free_ports()
    flags = []
    for service in ("gateway", "llm", "vocoder"):
        flags += [f"--{service}-port", str(ports.grpc[service]), f"--{service}-metrics-port", str(ports.metrics[service])]
    flags += ["--http-port", "0", "--replicas", "2", "--no-encoder", "--admission", "count", "--max-turns", "8"]
    up = UpProcess(flags)
    gateway = f"127.0.0.1:{ports.grpc['gateway']}"
    llm_targets = [f"127.0.0.1:{ports.grpc['llm'] + step}" for step in (0, 10)]

    def both_llms_ready() -> bool:
        try:
            text = scrape(ports.metrics["gateway"])
        except OSError:
            return False
        return all(metric_value(text, "gateway_replica_ready", f'{{backend="llm",target="{t}"}}') == 1 for t in llm_targets)

    try:
        up.wait_until(lambda: "SIGHUP" in up.said() and both_llms_ready())
        before = processes(up.proc.pid)
        assert len(before) == 5, before
        stop = threading.Event()
        results: list = []

        async def load(worker: int) -> None:
            """Turns back to back until told to stop: each → its summary, or the status it failed with."""
            async with grpc.aio.insecure_channel(gateway) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                i = 0
                while not stop.is_set():
                    request = gateway_pb2.SynthesizeRequest(text=f"turn {worker}.{i}", sampling=LOAD)
                    try:
                        results.append([m async for m in stub.Synthesize(request, timeout=60)][-1].summary)
                    except Exception as err:  # noqa: BLE001 (every failure is a failed turn: the test reports it)
                        results.append(err)
                    i += 1

        async def session_and_load():
            async with converse(gateway, sampling=GREEDY) as alone:  # the session that no restart touches
                await alone.say("Hello, who are you?")
                expected = await alone.say("Tell me more.")
            workers = [asyncio.create_task(load(w)) for w in range(2)]
            async with converse(gateway, sampling=GREEDY) as conv:
                await conv.say("Hello, who are you?")
                up.proc.send_signal(signal.SIGHUP)
                await asyncio.to_thread(up.wait_until, lambda: "rolling restart: done" in up.said(), 180,
                                        "finished its rolling restart")
                await asyncio.to_thread(up.wait_until, both_llms_ready, 30, "saw both llm replicas ready again")
                second = await conv.say("Tell me more.")
            stop.set()
            await asyncio.gather(*workers)
            return expected, second

        expected, second = asyncio.run(session_and_load())
        failed = [r for r in results if not isinstance(r, gateway_pb2.SynthesisSummary)]
        assert not failed and len(results) >= 4, (failed, len(results), up.said(tail=30))
        assert all(r.audio_tokens == 16 for r in results)
        after = processes(up.proc.pid)
        assert after.keys() == before.keys()
        kept = [name for name in before if after[name] == before[name]]
        assert kept == [f"gateway:{ports.grpc['gateway']}"], (before, after)  # every llm and vocoder is a new process
        said = up.said()
        assert said.index("draining llm, vocoder") < said.index("llm, vocoder serving again") < said.index(
            "draining llm-2, vocoder-2")
        # The session goes on from the history the gateway kept: its second turn is given the whole history, as the
        # undisturbed session's was (their audio is not compared: this one's first turn shared the llm's batches with
        # the load, where a float32 sum in another order may pick another greedy token).
        assert second.summary.prompt_tokens == expected.summary.prompt_tokens
        assert second.summary.audio_tokens == expected.summary.audio_tokens == GREEDY.max_new_tokens
        assert up.stop() == 0
    finally:
        up.kill()
