"""Fault a running stack's GPU on purpose, as a kill that faults does: a process joins the MPS server of a running
stage (its environment read from /proc) and runs a kernel that stores far out of bounds. MPS reports the fatal
exception to every client of that GPU (docs/running.md, "Faults under MPS"), so `moss-serve up` takes the path it
takes when a stage's SIGKILL faults a neighbour: every GPU stage stopped and started again. bench/restart.sh's
`KILLS="fault"` uses it to time that path, which a kill reaches only now and then.

    python3 bench/gpu_fault.py --pid PID     # PID: a GPU stage of the stack (an MPS client); prints the fault's time
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

MPS_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES")


def client_env(pid: int) -> dict[str, str]:
    """The MPS variables of process `pid`'s environment (those that make a process a client of its server)."""
    pairs = (item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
    return {k: v for k, v in pairs if k in MPS_VARIABLES}


def fault() -> None:
    """A kernel storing 2^40 floats past a small buffer: an illegal memory access (a sticky error in this context)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def store_far(ptr, go_ptr):
        go = tl.load(go_ptr)
        tl.store(ptr + (1 << 40), 1.0, mask=go != 0)

    x = torch.zeros(1, device="cuda")
    go = torch.zeros(1, dtype=torch.int32, device="cuda")
    store_far[(1,)](x, go)  # compiled here, and masked off: the time printed below is the fault's, not the compile's
    torch.cuda.synchronize()
    go.fill_(1)
    print(f"fault at {time.time():.3f}", flush=True)
    store_far[(1,)](x, go)
    torch.cuda.synchronize()  # raises: the access was illegal


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pid", type=int, required=True, help="a GPU stage of the stack, an MPS client")
    args = p.parse_args()
    env = client_env(args.pid)
    if "CUDA_MPS_PIPE_DIRECTORY" not in env:
        print(f"process {args.pid} is no MPS client (no CUDA_MPS_PIPE_DIRECTORY): nothing to fault", file=sys.stderr)
        return 2
    os.environ.update(env)  # (before CUDA is touched: this process becomes a client of the same server)
    try:
        fault()
    except Exception as e:  # noqa: BLE001  the point: the driver's error for the illegal access
        # when the driver said so: on an H200 a stack's stages once found the fault 11.2 s after the store
        # (docs/benchmarks.md, starts-2026-11-30), so whether the store or its report waited is worth knowing
        print(f"faulted at {time.time():.3f}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
        os._exit(0)  # (no teardown in a faulted context)
    print("the kernel did not fault", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
