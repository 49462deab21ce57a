"""The three services as separate processes on one host: start, wait until healthy, stop.

Used by `moss-serve up`, `make demo` and the integration tests.
"""

from __future__ import annotations

import os
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

SERVICES = ("llm", "vocoder", "gateway")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Ports:
    grpc: dict[str, int] = field(default_factory=lambda: {"gateway": 50051, "llm": 50052, "vocoder": 50053})
    metrics: dict[str, int] = field(default_factory=lambda: {"gateway": 9091, "llm": 9092, "vocoder": 9093})

    @classmethod
    def free(cls) -> "Ports":
        return cls({s: free_port() for s in SERVICES}, {s: free_port() for s in SERVICES})


def is_serving(target: str, timeout: float = 1.0, tls: ChannelTls | None = None) -> bool:
    try:
        with grpc.secure_channel(target, tls.credentials()) if tls else grpc.insecure_channel(target) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


class Stack:
    def __init__(self, ports: Ports | None = None, host: str = "127.0.0.1", extra_args: dict[str, list[str]] | None = None,
                 log_dir: str | Path | None = None, env: dict[str, dict[str, str]] | None = None,
                 health_tls: dict[str, ChannelTls] | None = None):
        """health_tls: service → how to reach it for its health check, where it serves TLS."""
        self.ports = ports or Ports()
        self.host = host
        self.extra_args = extra_args or {}
        self.log_dir = Path(log_dir) if log_dir else None
        self.env = env or {}  # service → what to add to its environment (e.g. an MPS daemon's pipe directory)
        self.health_tls = health_tls or {}
        self.procs: dict[str, subprocess.Popen] = {}

    def target(self, service: str) -> str:
        return f"{self.host}:{self.ports.grpc[service]}"

    def command(self, service: str) -> list[str]:
        cmd = [sys.executable, "-m", "services.cli", service, "--host", self.host,
               "--port", str(self.ports.grpc[service]), "--metrics-port", str(self.ports.metrics[service])]
        if service == "gateway":
            cmd += ["--llm-target", self.target("llm"), "--vocoder-target", self.target("vocoder")]
        return cmd + self.extra_args.get(service, [])

    def start(self, service: str) -> None:
        out = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / f"{service}.log", "ab")
        env = {**os.environ, **self.env.get(service, {}), "PYTHONUNBUFFERED": "1", PARENT_ENV: str(os.getpid())}
        self.procs[service] = subprocess.Popen(self.command(service), stdout=out, stderr=subprocess.STDOUT if out else None, env=env)

    def start_all(self, timeout: float = 120.0) -> None:
        for service in SERVICES:
            self.start(service)
        self.wait_serving(SERVICES, timeout)

    def wait_serving(self, services=SERVICES, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        for service in services:
            while not is_serving(self.target(service), tls=self.health_tls.get(service)):
                proc = self.procs.get(service)
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{service} exited with code {proc.returncode} before serving{self._log_hint(service)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{service} not serving on {self.target(service)} after {timeout:.0f} s{self._log_hint(service)}")
                time.sleep(0.2)

    def _log_hint(self, service: str) -> str:
        return f" (log: {self.log_dir / f'{service}.log'})" if self.log_dir else ""

    def stop(self, service: str, timeout: float = 15.0) -> int | None:
        proc = self.procs.pop(service, None)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self) -> None:
        for service in reversed(SERVICES):
            self.stop(service)

    def __enter__(self) -> "Stack":
        try:
            self.start_all()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
