"""The four services as separate processes on one host: start, wait until healthy, stop.

Used by `moss-serve up`, `make demo` and the integration tests. With `replicas`, llm and vocoder run as
several processes each ("llm", "llm-2", ...; "vocoder", "vocoder-2", ...), all behind the one gateway.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.lifetime import PARENT_ENV
from services.common.tls import ChannelTls
from services.settings import GRPC_PORTS, HTTP_PORT, METRICS_PORTS
from services.spare import Spare
from services.supervisor import report

SERVICES = ("llm", "vocoder", "encoder", "gateway")
NO_SPEECH = ("encoder",)  # Stack(without=...): a stack that takes no spoken turns (tests)
REPLICATED = ("llm", "vocoder")
TORCH_STAGES = ("llm", "vocoder", "encoder")  # the processes whose math runs in torch (their --cpu-threads)


def instances(replicas: dict[str, int] | None = None) -> list[str]:
    """The processes of a stack, in start order: "llm", "llm-2", ..., "vocoder", ..., "encoder", "gateway"."""
    replicas = replicas or {}
    for service, n in replicas.items():
        if service not in REPLICATED or n < 1:
            raise ValueError(f"replicas: {service}={n} (llm and vocoder, 1 or more)")
    return [name for service in SERVICES
            for name in [service, *(f"{service}-{i}" for i in range(2, replicas.get(service, 1) + 1))]]


def cpu_share(names: list[str]) -> int:
    """Threads for each torch process of a stack on a CPU: its cores shared among the llm and vocoder processes,
    which work all the time (the encoder, only while someone speaks, gets as many), at least one each. Each taking
    every core, their threads wait on one another's: on 2 cores, 2 streams started at once had a chunk late in 16 of
    24 bursts, against 0 of 17 at a core each (docs/benchmarks.md, cpu-threads-2026-11-30)."""
    busy = sum(service_of(name) in REPLICATED for name in names)
    return max(1, len(os.sched_getaffinity(0)) // max(1, busy))


def on_cpu(command: list[str]) -> bool:
    """Whether a service's command runs it on a CPU (its last --device, else the default: cpu)."""
    devices = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "--device"]
    return not devices or devices[-1] == "cpu"


def service_of(name: str) -> str:
    """"llm-2" → "llm"."""
    return name.split("-", 1)[0]


def replica_number(name: str) -> int:
    """"llm" → 1, "llm-2" → 2."""
    return int(name.split("-", 1)[1]) if "-" in name else 1


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux; its default elsewhere)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


_GIVEN: set[int] = set()  # ports this process has handed out


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a service to bind a moment later: below the ephemeral range, where the kernel picks
    neither a port to bind(0) nor the source port of a connection (a port from bind(0) could be taken by any client
    connection before the service bound it), never one this process gave before, and chosen at random, so that
    processes choosing at once (test workers) rarely choose alike."""
    low = _ephemeral_ports()[0]
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:  # that range full: the kernel's choice
        s.bind((host, 0))
        return s.getsockname()[1]


SPARE_TRIES = 3  # spares of one instance that may exit by themselves before it is given no more
# Spares kept for each instance. Two, because a spare can be spent without serving: after a kill that faulted the MPS
# server, the dead stage's spare is refused at its start (it exits 3, and the stages still on the faulted server are
# stopped), and its restart then waited seconds for the next spare's imports (4.3 s of an H200's 20.3 s, 2026-11-30).
SPARES_EACH = 2


def listener_pid(port: int) -> int | None:
    """The process listening on this TCP port on this host (Linux's /proc), or None. A service started from its spare
    keeps the spare's command line (spare.py), so its port, not its command, names it (bench/restart.sh's kills)."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()  # sl, local address:port (hex), remote, state (0A: LISTEN), ..., inode (10th)
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                sockets.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in sockets for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:  # gone, or not ours to look into
            continue
    return None


class ServiceExited(RuntimeError):
    """A service of the stack exited before it served (it said why on its stderr: a setting, a checkpoint, its GPU)."""


@dataclass
class Ports:
    grpc: dict[str, int] = field(default_factory=lambda: dict(GRPC_PORTS))
    metrics: dict[str, int] = field(default_factory=lambda: dict(METRICS_PORTS))
    http: int = HTTP_PORT  # the gateway's HTTP door (0: off)

    @classmethod
    def spaced(cls, grpc: dict[str, int], metrics: dict[str, int], replicas: dict[str, int] | None = None,
               step: int = 10, http: int = HTTP_PORT) -> "Ports":
        """Each service's ports as given; replica k of it on those plus step x (k - 1)."""
        names = instances(replicas)
        offset = {name: step * (replica_number(name) - 1) for name in names}
        return cls({n: grpc[service_of(n)] + offset[n] for n in names},
                   {n: metrics[service_of(n)] and metrics[service_of(n)] + offset[n] for n in names}, http)  # 0: off

    @classmethod
    def free(cls, replicas: dict[str, int] | None = None, http: bool = False) -> "Ports":
        """Free ports for every service; the gateway's HTTP door on one too with `http`, else off."""
        names = instances(replicas)
        return cls({s: free_port() for s in names}, {s: free_port() for s in names}, free_port() if http else 0)


def is_serving(target: str, timeout: float = 1.0, tls: ChannelTls | None = None, service: str = "") -> bool:
    """Whether the health check of `service` (the server as a whole by default) says SERVING."""
    try:
        with grpc.secure_channel(target, tls.credentials()) if tls else grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=timeout)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


class Stack:
    def __init__(self, ports: Ports | None = None, host: str = "127.0.0.1", extra_args: dict[str, list[str]] | None = None,
                 log_dir: str | Path | None = None, env: dict[str, dict[str, str]] | None = None,
                 health_tls: dict[str, ChannelTls] | None = None, replicas: dict[str, int] | None = None,
                 without: tuple[str, ...] = (), spares: tuple[str, ...] = (), spares_each: int = SPARES_EACH,
                 cpu_threads: int | None = None):
        """extra_args, env, health_tls: by service ("llm": every llm replica) or by instance ("llm-2": that one
        too); env is what to add to its environment (e.g. an MPS daemon's pipe directory); health_tls is how to
        reach it for its health check, where it serves TLS. replicas: service → processes (llm, vocoder).
        without: services not started (the encoder, for a stack that takes no spoken turns: tests).
        spares: services whose every process keeps `spares_each` spares once it runs (spare.py: `keep_spares`),
        which its next starts then use, the oldest first.
        cpu_threads: torch's threads in each llm, vocoder and encoder process on a CPU (None: their share of this
        machine's cores, `cpu_share`; 0: torch's default, every core each), where its own flags give none."""
        if unknown := set(without) - {"encoder"}:
            raise ValueError(f"without: only the encoder may be left out, not {', '.join(sorted(unknown))}")
        self.names = [name for name in instances(replicas) if service_of(name) not in without]
        self.ports = ports or Ports()
        if missing := [name for name in self.names if name not in self.ports.grpc or name not in self.ports.metrics]:
            raise ValueError(f"no ports for {', '.join(missing)}")
        self.host = host
        self.extra_args = extra_args or {}
        self.log_dir = Path(log_dir) if log_dir else None
        self.env = env or {}
        self.health_tls = health_tls or {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.spare_services = set(spares)
        self.spares_each = spares_each
        self.cpu_threads = cpu_share(self.names) if cpu_threads is None else cpu_threads
        self.spares: dict[str, list[Spare]] = {}  # by instance, the oldest first (the likeliest to be done importing)
        self.spare_deaths: dict[str, int] = {}  # spares that exited by themselves, by instance

    @staticmethod
    def _settings(table: dict, name: str) -> list:
        """table's entries for the instance's service, then for the instance itself ("llm", then "llm-2")."""
        return [table[key] for key in dict.fromkeys([service_of(name), name]) if key in table]

    def replicas(self, service: str) -> list[str]:
        return [name for name in self.names if service_of(name) == service]

    def target(self, service: str) -> str:
        return f"{self.host}:{self.ports.grpc[service]}"

    def command(self, name: str) -> list[str]:
        cmd = [sys.executable, "-m", "services.cli", service_of(name), "--host", self.host,
               "--port", str(self.ports.grpc[name]), "--metrics-port", str(self.ports.metrics[name])]
        if name == "gateway":
            cmd += ["--http-port", str(self.ports.http),
                    "--llm-target", ",".join(map(self.target, self.replicas("llm"))),
                    "--vocoder-target", ",".join(map(self.target, self.replicas("vocoder")))]
            if self.replicas("encoder"):
                cmd += ["--encoder-target", ",".join(map(self.target, self.replicas("encoder")))]
        cmd += [arg for args in self._settings(self.extra_args, name) for arg in args]
        if service_of(name) in TORCH_STAGES and self.cpu_threads and "--cpu-threads" not in cmd and on_cpu(cmd):
            cmd += ["--cpu-threads", str(self.cpu_threads)]
        return cmd

    def _log(self, name: str):
        """Its log file, opened to append (None: the processes write to this one's stderr)."""
        if not self.log_dir:
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return open(self.log_dir / f"{name}.log", "ab")

    def _env(self, name: str) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid())}
        for extra in self._settings(self.env, name):
            env.update(extra)
        return env

    def start(self, name: str) -> bool:
        """Start one process: its oldest spare that fits and still waits, else a new one → whether a spare served.
        From the main thread: it ends when the thread that started it does (lifetime.py)."""
        command, env = self.command(name), self._env(name)
        kept = self.spares.get(name, [])
        while kept:
            spare = kept.pop(0)
            proc = spare.go() if spare.fits(command, env) else None
            if proc is not None:
                self.procs[name] = proc
                return True
            spare.discard()
        out = self._log(name)
        self.procs[name] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT if out else None, env=env)
        return False

    def keep_spares(self) -> None:
        """`spares_each` spares for each running process of the spared services (spare.py). Called by the
        supervisor: the first ones once the stack serves, not beside its start, and new ones once the services it started
        again serve (supervisor.py)."""
        for name, kept in self.spares.items():
            for spare in [spare for spare in kept if spare.proc.poll() is not None]:
                kept.remove(spare)  # it exited by itself (spare.py: it touched the driver, or crashed)
                self.spare_deaths[name] = self.spare_deaths.get(name, 0) + 1
                if self.spare_deaths[name] == SPARE_TRIES:
                    report(f"{name}'s spares exited by themselves {SPARE_TRIES} times (the last with code "
                           f"{spare.proc.returncode}); {name} restarts without one")
        for name in self.names:
            if service_of(name) in self.spare_services and name in self.procs:
                kept = self.spares.setdefault(name, [])
                while len(kept) < self.spares_each and self.spare_deaths.get(name, 0) < SPARE_TRIES:
                    kept.append(Spare(self.command(name), self._env(name), self._log(name)))

    def drop_spares(self) -> None:
        for kept in self.spares.values():
            for spare in kept:
                spare.discard()
        self.spares.clear()

    def start_all(self, timeout: float = 120.0) -> None:
        for name in self.names:
            self.start(name)
        self.wait_serving(self.names, timeout)

    def serving(self, name: str, service: str = "", timeout: float = 1.0) -> bool:
        """Whether its health check (of `service`: the server as a whole by default) says SERVING now (at most
        `timeout` s of waiting)."""
        return is_serving(self.target(name), timeout, tls=(self._settings(self.health_tls, name) or [None])[-1],
                          service=service)

    def warm(self, name: str) -> bool:
        """Whether it serves with nothing left to prepare (server.py's WARM_SERVICE: a vocoder's graphs all captured)."""
        from services.common.server import WARM_SERVICE

        return self.serving(name, WARM_SERVICE)

    def wait_serving(self, services=None, timeout: float = 120.0) -> None:
        services = self.names if services is None else services
        deadline = time.monotonic() + timeout
        for service in services:
            while not self.serving(service):
                proc = self.procs.get(service)
                if proc is not None and proc.poll() is not None:
                    raise ServiceExited(f"{service} exited with code {proc.returncode} before serving{self._log_hint(service)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{service} not serving on {self.target(service)} after {timeout:.0f} s{self._log_hint(service)}")
                time.sleep(0.2)

    def _log_hint(self, service: str) -> str:
        return f" (log: {self.log_dir / f'{service}.log'})" if self.log_dir else ""

    def stop(self, *names: str, timeout: float = 15.0) -> None:
        """Stop these processes: SIGTERM to each at once, then up to `timeout` seconds for all of them to end
        before SIGKILL."""
        procs = [proc for name in names if (proc := self.procs.pop(name, None)) is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        """The spares, then the gateway (no new turns), then llm and vocoder together."""
        self.drop_spares()
        self.stop("gateway")
        self.stop(*reversed(self.names))

    def __enter__(self) -> "Stack":
        try:
            self.start_all()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
