"""Which kind of work, SIGKILLed under MPS, faults the other clients: trials of each kind, a table of how often.

On an H200 a vocoder's SIGKILL under load faulted the llm (an illegal memory access in its context, found by its idle
probe 1.0-1.4 s after the kill) in 5 of 15 kills, and an llm's kill faulted nothing in 5 (docs/benchmarks.md,
covers-2026-11-29); bare clients running matrix products never did (mps_fault.py). What the vocoder does that
those did not is the suspect. Each trial starts a victim under an MPS daemon of its own beside a neighbour that
stands in for the llm (25% of the SMs, as `moss-serve up` gives it, asking its device every 0.1 s whether it still
works: services/common/device.py's `lost`), lets the victim work for a random 0.3-1.5 s, SIGKILLs it and watches the
neighbour for 3 s. A faulted neighbour is started again (the faulted server takes no new client until every old one
is gone). Victims:
- `idle`: a context and memory, no work;
- `matmul`: bf16 products of 8192^2 back to back (what mps_fault.py killed);
- `graph`: a CUDA graph of 2,000 small Triton kernels, replayed back to back (a flow call's shape);
- `graph-pdl`: the same kernels launched with programmatic dependent launch, as the flow's and the llm's are
  (services/common/launch.py);
- `copies`: pinned host memory copied to and from the device on two streams of different priorities, with events
  (the vocoder's samples and its first-chunk lane);
- `capture`: capturing that graph again and again (the vocoder captures graphs while serving: capture.py).

    python3 bench/studies/mps_kill.py [--kinds idle,matmul,graph,graph-pdl,copies,capture] [--trials 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)

KINDS = ("idle", "matmul", "graph", "graph-pdl", "copies", "capture")

# The victim: prints "working" once its work has begun, then works until killed.
VICTIM = r"""
import sys, torch
kind = sys.argv[1]
sys.path.insert(0, ".")  # (run from the tree's root)
dev = torch.device("cuda")
x = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
if kind in ("graph", "graph-pdl", "capture"):
    import triton, triton.language as tl
    from services.common.launch import inputs_ready

    @triton.jit
    def step(x_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
        inputs_ready(PDL)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + i, mask=i < n)
        tl.store(x_ptr + i, v * 0.5 + 1.0, mask=i < n)

    pdl = kind == "graph-pdl"
    v = torch.zeros(256 * 1024, device=dev)
    def chain():
        for _ in range(2000):
            step[(v.numel() // 1024,)](v, v.numel(), BLOCK=1024, PDL=pdl, launch_pdl=pdl)
    chain()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    def capture():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            with torch.cuda.graph(g, stream=side):
                chain()
        return g
    g = capture()
if kind == "copies":
    host = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(host, device=dev)
    high, low = torch.cuda.Stream(priority=-1), torch.cuda.Stream(priority=0)
print("working", flush=True)
while True:
    if kind == "idle":
        torch.cuda.synchronize()
        import time; time.sleep(0.05)
    elif kind == "matmul":
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
    elif kind in ("graph", "graph-pdl"):
        for _ in range(4):
            g.replay()
        torch.cuda.synchronize()
    elif kind == "copies":
        for s in (high, low):
            with torch.cuda.stream(s):
                dst.copy_(host, non_blocking=True)
                host.copy_(dst, non_blocking=True)
                torch.cuda.Event().record(s)
        torch.cuda.synchronize()
    elif kind == "capture":
        g = capture()
        g.replay()
        torch.cuda.synchronize()
"""

# The neighbour: a context on 25% of the SMs, its device asked every 0.1 s; prints "ready", then "lost <unix time>".
NEIGHBOUR = r"""
import sys, time, torch
sys.path.insert(0, ".")
from services.common.device import lost
torch.ones(1, device="cuda").add_(1).item()
print("ready", flush=True)
while True:
    if lost("cuda"):
        print(f"lost {time.time():.3f}", flush=True)
        sys.exit(3)
    time.sleep(0.1)
"""


class Process:
    """A child running `code`, its output lines gathered by a thread (read with a timeout, never blocking)."""

    def __init__(self, code: str, env: dict, *args: str):
        # (from a file: Triton reads a kernel's source, which a `python -c` string does not have)
        path = Path(tempfile.gettempdir()) / f"mps_kill_{abs(hash(code))}.py"
        path.write_text(code)
        self.proc = subprocess.Popen([sys.executable, str(path), *args], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=Path(__file__).resolve().parents[2])
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)  # it exited

    def wait_for(self, prefix: str, timeout: float) -> str | None:
        """Its first line from now that starts with prefix, within timeout (None: it exited, or not in time)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                self.lines.put(None)
                return None
            if line.startswith(prefix):
                return line
        return None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_neighbour(env: dict) -> Process:
    """A neighbour that says it is ready; retried while the faulted server refuses new clients."""
    for _ in range(30):
        proc = Process(NEIGHBOUR, {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"})
        if proc.wait_for("ready", 60) is not None:
            return proc
        proc.kill()
        time.sleep(1.0)
    raise RuntimeError("the neighbour never started under the MPS daemon")


def trial(kind: str, env: dict, neighbour: Process) -> dict:
    victim = Process(VICTIM, env, kind)
    if victim.wait_for("working", 120) is None:
        victim.kill()
        return {"kind": kind, "error": "the victim never began its work"}
    time.sleep(random.uniform(0.3, 1.5))
    killed = time.time()
    os.kill(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait()
    line = neighbour.wait_for("lost", 3.0)
    if line is None and neighbour.proc.poll() is not None:
        return {"kind": kind, "faulted": True, "found_after_s": None}  # exited without saying why: a fault too
    return {"kind": kind, "faulted": line is not None,
            "found_after_s": round(float(line.split()[1]) - killed, 2) if line else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"--kinds: {', '.join(unknown)} (known: {', '.join(KINDS)})")
    random.seed(args.seed)

    from services.mps import MpsDaemon

    order = [k for _ in range(args.trials) for k in kinds]  # interleaved: a drift over time hits every kind alike
    results = []
    with MpsDaemon() as daemon:
        env = {**os.environ, **daemon.env()}
        neighbour = start_neighbour(env)
        for kind in order:
            result = trial(kind, env, neighbour)
            results.append(result)
            print(json.dumps(result), flush=True)
            if result.get("faulted"):
                neighbour.kill()
                neighbour = start_neighbour(env)
        neighbour.kill()
    print(f"\n{'victim':<10} {'kills':>5} {'faulted':>8}  found after (s)")
    for kind in kinds:
        mine = [r for r in results if r["kind"] == kind and "error" not in r]
        found = [r["found_after_s"] for r in mine if r["faulted"]]  # (None: exited without a word)
        print(f"{kind:<10} {len(mine):>5} {sum(r['faulted'] for r in mine):>8}  {found}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"trials": results, "kinds": kinds}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
