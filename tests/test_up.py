"""`moss-serve up` beyond the engine's options (test_presets.py): it forwards the gateway's options, serves TLS
from one directory of certificates, runs llm and vocoder replicas (one per GPU with --gpus), and starts an MPS
daemon that died again, then the GPU services that were its clients."""

import asyncio
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import UpProcess, metric_value, scrape
from moss.speech.v1 import common_pb2
from test_mps import stand_in  # noqa: F401  (a fixture: the stand-in MPS daemon)
from test_tls import make_ca, make_leaf, write

from services.cli import main, parser
from services.common.tls import StackTls
from services.gateway.client import synthesize
from services.mps import MpsDaemon
from services.stack import Ports, is_serving
from services.up import CPU_START_QUIET, MpsKeeper, cpu_turns, gpu_env, replicas, up_service_args


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory):
    """Certificates as docker-compose.tls.yml reads them: ca, server, gateway-client."""
    d = tmp_path_factory.mktemp("tls")
    ca = make_ca("moss up CA")
    write(d, "ca", *ca)
    for name in ("server", "gateway-client"):
        write(d, name, *make_leaf(ca, name))
    return d

# what `up` adds to the gateway's flags on a CPU (tests/test_presets.py checks the figures)
CPU_ADMISSION = ["--admission", "headroom", "--admit-initial-turns", str(cpu_turns()), "--admit-burst-turns",
                 str(cpu_turns()), "--admit-start-quiet", str(CPU_START_QUIET)]


def test_up_forwards_the_gateway_options():
    argv = ["--max-turns", "7", "--max-queued-turns", "3", "--session-idle-seconds", "9.5", "--ready-wait", "2",
            "--health-check-seconds", "0.25", "--max-text-chars", "300", "--max-message-bytes", "4096",
            "--max-streams-per-connection", "12", "--api-keys-file", "/keys"]
    gateway = parser().parse_args(["gateway", *up_service_args(parser().parse_args(["up", *argv]))["gateway"]])
    alone = parser().parse_args(["gateway", *argv, *CPU_ADMISSION])
    assert vars(gateway) == vars(alone)
    assert (gateway.max_turns, gateway.session_idle_seconds, gateway.api_keys_file) == (7, 9.5, "/keys")


def test_up_defaults_match_gateway_defaults():
    """But admission, which `up` sets for its device (on this CPU: headroom from a turn per two cores)."""
    gateway = parser().parse_args(["gateway", *up_service_args(parser().parse_args(["up"]))["gateway"]])
    assert vars(gateway) == vars(parser().parse_args(["gateway", *CPU_ADMISSION]))


def test_up_tls_dir_gives_every_service_its_flags(tls_dir):
    extra = up_service_args(parser().parse_args(["up", "--tls-dir", str(tls_dir)]))
    llm, vocoder, gateway = (parser().parse_args([name, *extra[name]]) for name in ("llm", "vocoder", "gateway"))
    for service in (llm, vocoder):  # mutual TLS: only the gateway's certificate gets in
        assert (service.tls_cert, service.tls_key, service.tls_client_ca) == (
            str(tls_dir / "server.pem"), str(tls_dir / "server.key"), str(tls_dir / "ca.pem"))
    assert (gateway.tls_cert, gateway.tls_client_ca) == (str(tls_dir / "server.pem"), None)
    assert (gateway.backend_ca, gateway.backend_cert, gateway.backend_key) == (
        str(tls_dir / "ca.pem"), str(tls_dir / "gateway-client.pem"), str(tls_dir / "gateway-client.key"))


def test_up_refuses_a_tls_dir_without_its_files(tmp_path, capsys):
    (tmp_path / "ca.pem").write_text("x")
    t0 = time.monotonic()
    assert main(["up", "--tls-dir", str(tmp_path)]) == 2
    assert "no server.pem, server.key, gateway-client.pem, gateway-client.key" in capsys.readouterr().err
    assert time.monotonic() - t0 < 5  # before anything started


def test_gpus_give_each_replica_its_own():
    args = parser().parse_args(["up", "--device", "cuda", "--gpus", "0,3"])
    assert replicas(args) == 2
    env = gpu_env(args, ["llm", "llm-2", "vocoder", "vocoder-2", "gateway"])
    assert env == {"llm": {"CUDA_VISIBLE_DEVICES": "0"}, "llm-2": {"CUDA_VISIBLE_DEVICES": "3"},
                   "vocoder": {"CUDA_VISIBLE_DEVICES": "0"}, "vocoder-2": {"CUDA_VISIBLE_DEVICES": "3"}}
    assert replicas(parser().parse_args(["up", "--replicas", "3"])) == 3 and gpu_env(parser().parse_args(["up"]), ["llm"]) == {}


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "0,1"], "--gpus needs --device cuda"),
    (["--device", "cuda", "--gpus", "0,1", "--replicas", "3"], "--replicas 3 but 2 --gpus"),
])
def test_up_refuses_gpus_that_do_not_fit(argv, message, capsys):
    assert main(["up", *argv]) == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--gpus", "0,0"], ["--gpus", "a"], ["--replicas", "0"]])
def test_bad_replica_flags_are_usage_errors(argv):
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["up", *argv])
    assert info.value.code == 2


def spaced_free_ports() -> Ports:
    """Free ports for a stack, and free 10 above them too (where `up` puts the second replicas)."""
    while True:
        ports = Ports.free()
        try:
            for port in [*ports.grpc.values(), *ports.metrics.values()]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 10))
            return ports
        except OSError:
            continue


def test_moss_serve_up_runs_replicas_over_tls(tls_dir):
    """Two llm and two vocoder replicas behind the gateway, every hop over TLS (mutual inside), the gateway's
    options as given: a client with the CA speaks, and its turns are spread over the replicas."""
    ports = spaced_free_ports()
    flags = []
    for service in ("gateway", "llm", "vocoder"):
        flags += [f"--{service}-port", str(ports.grpc[service]), f"--{service}-metrics-port", str(ports.metrics[service])]
    flags += ["--http-port", "0"]
    flags += ["--replicas", "2", "--tls-dir", str(tls_dir), "--max-turns", "5", "--no-encoder",
              "--admission", "count"]  # (its four turns at once: more than a CPU's headroom lets in)
    up = UpProcess(flags)
    tls = StackTls(str(tls_dir))
    gateway = f"127.0.0.1:{ports.grpc['gateway']}"
    llm_2 = f"127.0.0.1:{ports.grpc['llm'] + 10}"
    try:
        up.wait_until(lambda: is_serving(gateway, tls=tls.client(mutual=False)) and is_serving(llm_2, tls=tls.client(mutual=True)))
        assert not is_serving(llm_2, timeout=0.5, tls=tls.client(mutual=False))  # no client certificate: refused
        gateway_metrics = ports.metrics["gateway"]
        deadline = time.monotonic() + 10
        llm_1 = f"127.0.0.1:{ports.grpc['llm']}"
        for target in (llm_1, llm_2):  # both, or every turn may go to the one the gateway has seen ready so far
            while metric_value(scrape(gateway_metrics), "gateway_replica_ready", f'{{backend="llm",target="{target}"}}') != 1:
                assert time.monotonic() < deadline, f"the gateway never saw {target} ready"
                time.sleep(0.1)

        async def four():
            sampling = common_pb2.SamplingParams(max_new_tokens=6, seed=3)
            return await asyncio.gather(*(synthesize(gateway, "Hi", sampling=sampling, tls=tls.client(mutual=False))
                                          for _ in range(4)))

        assert all(r.summary.audio_tokens == 6 for r in asyncio.run(four()))
        for port in (ports.metrics["llm"], ports.metrics["llm"] + 10):
            assert metric_value(scrape(port), "llm_requests_total", '{code="OK"}') >= 1  # both replicas took turns
        assert metric_value(scrape(gateway_metrics), "gateway_replica_calls", f'{{backend="llm",target="{llm_2}"}}') == 0

        # the gateway's own options as given (--max-turns 5; test_admission.py holds the gateway to them)
        assert metric_value(scrape(gateway_metrics), "gateway_admission_limit") == 5
        assert up.stop() == 0
    finally:
        up.kill()


class FakeProc:
    def __init__(self, code=None):
        self.returncode = code

    def poll(self):
        return self.returncode


class FakeStack:
    """What MpsKeeper uses of a Stack: its processes, stop and start."""

    spare_services = frozenset()  # (keeps no spares)

    def __init__(self):
        self.names = ["llm", "llm-2", "vocoder", "vocoder-2", "gateway"]
        self.procs = {name: FakeProc() for name in self.names}
        self.calls = []

    def stop(self, *names):
        self.calls.append(("stop", *names))
        for name in names:
            self.procs.pop(name, None)

    def start(self, name):
        self.calls.append(("start", name))
        self.procs[name] = FakeProc()


class FakeSupervisor:
    def __init__(self):
        self.told, self.expected = [], []

    def started(self, name, now=None):
        self.told.append(name)

    def expect_exit(self, name):
        self.expected.append(name)


GPU = ["llm", "llm-2", "vocoder", "vocoder-2"]


def test_a_dead_mps_daemon_is_started_again_then_its_clients(stand_in, monkeypatch):  # noqa: F811
    stack, supervisor, said = FakeStack(), FakeSupervisor(), []
    with MpsDaemon(binary=stand_in) as daemon:
        keeper = MpsKeeper(daemon, stack, supervisor, [GPU], log=said.append)
        keeper.poll()
        assert not stack.calls and keeper.restarts == 0  # alive: nothing to do
        first = daemon.proc
        first.kill()
        first.wait()
        monkeypatch.setenv("FAIL_AT_START", "1")  # the first try to start it again fails...
        keeper.poll(now=100.0)
        assert "exited with code" in said[0] and "trying again in 1 s" in said[-1] and not stack.calls
        keeper.poll(now=100.5)  # ... and is not tried again before its backoff
        assert keeper.restarts == 0
        monkeypatch.delenv("FAIL_AT_START")
        keeper.poll(now=101.0)
        assert keeper.restarts == 1 and daemon.proc is not first and daemon.proc.poll() is None
        assert (daemon.root / "pipe" / "control").exists()
        # restarted as the new daemon's clients (all stopped first, together); the gateway stays
        assert stack.calls == [("stop", *GPU)] + [("start", name) for name in GPU]
        assert supervisor.told == GPU
        assert "restarting llm, llm-2, vocoder, vocoder-2" in said[-1]
    assert daemon.proc is None


@pytest.mark.parametrize("groups, stopped", [
    ([GPU], ["llm", "vocoder", "vocoder-2"]),                         # one GPU: every other client
    ([["llm", "vocoder"], ["llm-2", "vocoder-2"]], ["vocoder-2"]),    # --gpus 0,1: the dead one's GPU only
])
def test_a_dead_client_takes_the_others_of_its_gpu_with_it(stand_in, groups, stopped):  # noqa: F811
    stack, said, supervisor = FakeStack(), [], FakeSupervisor()
    with MpsDaemon(binary=stand_in) as daemon:
        keeper = MpsKeeper(daemon, stack, supervisor, groups, log=said.append, shared_fate=True)
        stack.procs["llm-2"].returncode = -9  # killed
        keeper.poll()
        assert stack.calls == [("stop", *stopped)]  # the supervisor starts them again, the dead one too
        assert supervisor.expected == stopped       # ... the stopped at once: they did not fail
        assert "llm-2 died (-9); stopping" in said[-1] and "gateway" not in said[-1]
        keeper.poll()
        assert len(stack.calls) == 1  # dealt with once
        for name in stopped:  # as the supervisor does
            stack.start(name)
        stack.start("llm-2")
        stack.procs["llm-2"].returncode = 1  # a plain exit (the MPS server not ready yet, say): the others stay
        keeper.poll()
        assert stack.calls[-1] == ("start", "llm-2")
        stack.procs["vocoder-2"].returncode = 3  # its device lost: the others of its GPU still up go too
        group = next(g for g in groups if "vocoder-2" in g)
        up_there = [n for n in group if n != "vocoder-2" and stack.procs[n].poll() is None]
        keeper.poll()
        assert stack.calls[-1] == (("stop", *up_there) if up_there else ("start", "llm-2"))


@pytest.mark.parametrize("code", [3, -6])  # DeviceLost.EXIT_CODE; SIGABRT (PyTorch's destructors on a sticky error)
def test_by_default_a_killed_client_leaves_its_neighbours_and_one_that_lost_its_gpu_takes_them(stand_in, code):  # noqa: F811
    """The default (--no-mps-shared-fate): a SIGKILLed client is the supervisor's alone to start again; one that exits
    saying its GPU context is lost, or aborts (a fault, injected here as its exit code), takes the others of its GPU
    with it."""
    stack, said = FakeStack(), []
    with MpsDaemon(binary=stand_in) as daemon:
        keeper = MpsKeeper(daemon, stack, FakeSupervisor(), [GPU], log=said.append)
        stack.procs["llm-2"].returncode = -9
        keeper.poll()
        assert stack.calls == [] and said == []
        stack.procs["vocoder"].returncode = code
        keeper.poll()
        assert stack.calls == [("stop", "llm", "vocoder-2")] and f"vocoder died ({code})" in said[-1]
    assert parser().parse_args(["up"]).mps_shared_fate is False
    assert parser().parse_args(["up", "--mps-shared-fate"]).mps_shared_fate is True


def test_a_supervisor_told_of_a_start_does_not_start_it_again():
    from services.supervisor import Supervisor

    class Proc:
        returncode = 1

        def __init__(self, alive):
            self.alive = alive

        def poll(self):
            return None if self.alive else 1

    stack = SimpleNamespace(procs={"llm": Proc(alive=False)}, started=[], spare_services=())
    stack.start = lambda name: stack.started.append(name)
    supervisor = Supervisor(stack, log=lambda m: None)
    supervisor.poll(now=0.0)  # it died: to be started again after 1 s ...
    stack.procs["llm"] = Proc(alive=True)
    supervisor.started("llm", now=0.5)  # ... but someone else did it first
    supervisor.poll(now=2.0)
    assert stack.started == []


def test_up_stops_with_one_line_when_a_service_cannot_start(tmp_path):
    """A service that exits before serving (here an llm given an empty model directory) stops the stack: `moss-serve
    up` says which service and why in a line each, exits 1, and leaves no traceback and nothing running."""
    ports = spaced_free_ports()
    flags = ["--model-dir", str(tmp_path)]
    for service in ("gateway", "llm", "vocoder", "encoder"):
        flags += [f"--{service}-port", str(ports.grpc[service]), f"--{service}-metrics-port", str(ports.metrics[service])]
    flags += ["--http-port", "0"]
    proc = subprocess.run([sys.executable, "-m", "services.cli", "up", *flags], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "moss-serve up: llm exited with code" in proc.stderr and "before serving" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not is_serving(f"127.0.0.1:{ports.grpc['gateway']}")


def test_a_stack_on_a_cpu_shares_the_cores_among_its_torch_stages(monkeypatch):
    """Each llm, vocoder and encoder process on a CPU is given its share of the cores (the llm and vocoder processes
    split them; each taking every core, 2 streams on 2 cores had chunks late: docs/benchmarks.md cpu-threads-2026-11-30);
    a stage on a GPU, one given its own count, and `--cpu-threads 0` are left to torch's default."""
    from services.stack import Stack

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))

    def threads(stack: Stack, name: str) -> str | None:
        cmd = stack.command(name)
        return cmd[cmd.index("--cpu-threads") + 1] if "--cpu-threads" in cmd else None

    two = Stack(Ports.free({"llm": 2, "vocoder": 2}), replicas={"llm": 2, "vocoder": 2})
    assert [threads(two, n) for n in ("llm", "llm-2", "vocoder", "vocoder-2", "encoder", "gateway")] == ["2"] * 5 + [None]
    one = Stack(Ports.free({"vocoder": 2}), without=("encoder",), replicas={"vocoder": 2},
                extra_args={"llm": ["--device", "cuda"], "vocoder-2": ["--cpu-threads", "3"]})
    assert [threads(one, n) for n in ("llm", "vocoder", "vocoder-2")] == [None, "2", "3"]
    assert threads(Stack(Ports.free(), extra_args={"llm": ["--device", "cuda", "--device", "cpu"]}), "llm") == "4"
    assert threads(Stack(Ports.free(), cpu_threads=0), "llm") is None
    assert parser().parse_args(["up", "--cpu-threads", "0"]).cpu_threads == 0 and parser().parse_args(["up"]).cpu_threads is None


def test_the_stacks_torch_stages_run_on_their_share_of_the_cores(stack):
    """The processes themselves: each torch stage of the tests' stack (started as `up` starts it) says the threads
    its math runs on, its share of this machine's cores."""
    from services.stack import cpu_share

    share = cpu_share(stack.names)
    for name in ("llm", "vocoder", "encoder"):
        log = (stack.log_dir / f"{name}.log").read_text()
        assert f"{name}: torch's CPU math on {share} thread(s)" in log, log[-2000:]
