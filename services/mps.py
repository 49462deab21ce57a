"""A CUDA MPS control daemon for the stack's GPU processes (`moss-serve up --mps`).

Without MPS, the llm and the vocoder are two CUDA contexts on one GPU, and the GPU time-slices between
them: while one process's kernels run, the other's wait, however few multiprocessors they would need.
Under MPS both processes are clients of one server, and their kernels run side by side.

The daemon runs in the foreground as a child of `moss-serve up`, with a pipe directory of its own, so
it serves only this stack's processes (the ones given `env()`) and leaves the GPU's settings (compute
mode, clocks) as they are. Stopping it waits for its clients, so stop the services first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from services.common.lifetime import preexec_die_with_parent

CONTROL = "nvidia-cuda-mps-control"


class MpsUnavailable(RuntimeError):
    """The MPS control daemon could not be found or did not start."""


class MpsDaemon:
    def __init__(self, root: str | Path | None = None, binary: str | None = None):
        self.owns_root = root is None
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="moss-mps-"))
        self.binary = binary or shutil.which(CONTROL)
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to be a client of this daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(self.root / "log")}

    def start(self, timeout: float = 10.0) -> None:
        if not self.binary:
            if self.owns_root:
                shutil.rmtree(self.root, ignore_errors=True)
            raise MpsUnavailable(f"--mps: {CONTROL} not found on PATH (it comes with NVIDIA's driver utilities)")
        for path in self.env().values():
            Path(path).mkdir(parents=True, exist_ok=True)
        control = self.root / "pipe" / "control"  # the daemon's socket: clients connect through it
        control.unlink(missing_ok=True)  # left by a daemon that died: not a sign of the new one
        self.proc = subprocess.Popen([self.binary, "-f"], env={**os.environ, **self.env()},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=preexec_die_with_parent())  # ends with us, even on SIGKILL
        deadline = time.monotonic() + timeout
        while not control.exists():
            if self.proc.poll() is not None:
                raise MpsUnavailable(f"--mps: {CONTROL} exited with code {self.proc.returncode}; "
                                     f"its log: {self.root / 'log' / 'control.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise MpsUnavailable(f"--mps: {CONTROL} did not open {control} within {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the daemon to quit (it waits for its clients, up to `timeout`), then make sure it has."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                subprocess.run([self.binary], input=b"quit\n", env={**os.environ, **self.env()},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.root if self.owns_root else self.root / "pipe", ignore_errors=True)

    def __enter__(self) -> "MpsDaemon":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
