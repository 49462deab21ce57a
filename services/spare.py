"""A service's spare process: started ahead by `moss-serve up`, it has imported what the service runs on and waits.
When the service's process exits, the supervisor tells the spare to go, and it serves under the same command line
without paying for its imports again. What a service reads on the CPU before it touches the GPU, a spare reads ahead
too (cli.py's read_ahead: the vocoder's codec, the encoder's weights).

Why: a GPU stage's restart is mostly its start. On an H200 a vocoder took 6-10 s from its death to its first log line
(imports of torch, Triton and its own modules, then CUDA), out of 12-14 s to serving again; beside a loaded stack the
imports alone took longer (docs/benchmarks.md, start-2026-11-29 and spare-2026-11-30).

A spare must not touch the GPU before it goes. Under MPS a process becomes a client of the server of its day when it
initialises the driver (cuInit), and after a fault that server takes no client until all of its old ones are gone: a
spare that had initialised CUDA would be one of those. Importing torch maps the driver's library (on an H200 every
spare had libcuda.so loaded after its imports) but does not initialise it. So a spare imports modules and reads on the
CPU only, and then asks the driver whether it was initialised (cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED
until cuInit); if it was, the spare exits, and the supervisor starts the service afresh instead. What it reads ahead
stays on the CPU (at the real size a vocoder's spare holds its codec there, ~0.5 GB, and an encoder's its weights,
~1.4 GB).

    python -m services.spare vocoder --port ... (the service's own arguments, as after `python -m services.cli`)
"""

from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import sys

GO = b"go\n"
# What each service's start imports before it does any work: its heavy modules (cli.py imports the server module
# of its service; the rest come with it or soon after).
# torch._dynamo for the llm: its start from a checkpoint builds the model on the meta device to check the checkpoint's
# keys, and the first meta initialisation imports it through torch._refs (0.9-1.3 s on a 2-core CPU, 0.03 s once
# imported). (The weights' size comes from the config: MossSpeechConfig.num_parameters.)
PRELOAD = {
    "llm": ("torch", "torch._dynamo", "services.llm.server", "services.llm.engine.engine",
            "services.llm.model.checkpoint"),
    "vocoder": ("torch", "triton", "services.vocoder.server", "services.vocoder.loader"),
    "encoder": ("torch", "triton", "services.encoder.server"),
}
DRIVER = "libcuda.so.1"
CUDA_ERROR_NOT_INITIALIZED = 3


def driver_initialized() -> bool:
    """Whether this process has initialised the CUDA driver (cuInit: what makes it an MPS client). A process that has
    not loaded the driver's library has not; one that has is asked with a call that needs cuInit and makes none."""
    try:
        lib = ctypes.CDLL(DRIVER, mode=os.RTLD_NOLOAD)  # only if already loaded: loading it here would prove nothing
    except OSError:
        return False
    count = ctypes.c_int()
    return lib.cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from services.common.lifetime import die_with_parent

    die_with_parent()
    for module in PRELOAD.get(argv[0] if argv else "", ()):
        importlib.import_module(module)
    from services.cli import read_ahead

    try:
        read_ahead(argv)
    except Exception as e:  # noqa: BLE001  (a codec that cannot be read: the service's own start says so)
        print(f"moss-serve spare for {argv[0]}: nothing read ahead ({type(e).__name__}: {e})", file=sys.stderr)
    if driver_initialized():
        print(f"moss-serve spare for {argv[0]}: an import initialised the CUDA driver; a spare must not be a GPU "
              f"client before it serves, so it exits", file=sys.stderr)
        return 1
    if sys.stdin.buffer.readline() != GO:  # EOF: up stopped, or set this spare aside
        return 0
    from services.cli import main as cli

    return cli(argv)


class Spare:
    """`moss-serve up`'s handle on one spare: the command line and environment it will serve with."""

    def __init__(self, command: list[str], env: dict[str, str], stdout=None):
        """command: the service's own command (`python -m services.cli SERVICE ...`); env: its environment."""
        self.command, self.env = list(command), dict(env)
        args = command[command.index("services.cli") + 1:]
        self.proc = subprocess.Popen([sys.executable, "-m", "services.spare", *args], stdin=subprocess.PIPE,
                                     stdout=stdout, stderr=subprocess.STDOUT if stdout else None, env=env)

    def fits(self, command: list[str], env: dict[str, str]) -> bool:
        """Whether it was started for exactly this command line and environment (an MPS share or a port may change)."""
        return self.command == list(command) and self.env == dict(env)

    def go(self) -> subprocess.Popen | None:
        """Tell it to serve → its process, or None if it has exited (it then cannot serve)."""
        if self.proc.poll() is not None:
            return None
        try:
            self.proc.stdin.write(GO)
            self.proc.stdin.flush()
            self.proc.stdin.close()  # (it reads one line; the pipe's end is of no use to it after that)
        except (BrokenPipeError, OSError):
            return None
        return self.proc

    def discard(self) -> None:
        """End it at once (SIGKILL: it holds nothing yet, no GPU context and no port)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


if __name__ == "__main__":  # (`python -m services.spare`: the module's own copy, so that what patches it is seen)
    from services.spare import main as spare_main

    sys.exit(spare_main())
