"""What one MPS client's death does to the others, on a real GPU.

Bare clients (default): under an MPS daemon of its own, client A runs matrix products without pause, client B
sits idle and asks its device every 0.5 s whether it still works (services/common/device.py's `lost`). A is
SIGKILLed mid-work. Reports when (if) B finds its context lost, and whether a new client C can start while B
holds on and after B has gone.

--stack synthesize|sessions: the real-size services instead, without `moss-serve up` (whose MpsKeeper would
stop the survivors at once): two llm replicas (the llm's kernels on 25% of the SMs) and a vocoder under one
MPS daemon, Synthesize calls or Converse sessions through the gateway, llm-2 SIGKILLed mid-load. Reports what
each survivor logged (a lost GPU?) and how the calls ended.

    python3 bench/studies/mps_fault.py [--stack synthesize|sessions] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import bench_path  # noqa: F401  (bench/ and the tree on the import path)

BUSY = """
import torch, sys
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    for _ in range(50):
        x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
"""
IDLE = """
import sys, time, torch
sys.path.insert(0, ".")
from services.common.device import lost
torch.ones(1, device="cuda").add_(1).item()
print("ready", flush=True)
start = time.monotonic()
while time.monotonic() - start < 60:
    if lost("cuda"):
        print(f"lost {time.time():.3f}", flush=True)
        sys.exit(3)
    time.sleep(0.5)
print("never lost", flush=True)
"""
NEW = """
import torch
torch.ones(1, device="cuda").add_(1).item()
print("started", flush=True)
"""


def spawn(code: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def new_client(env: dict) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", NEW], env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "hung for 60 s"
    out = (done.stdout + done.stderr).strip().splitlines()
    return "started" if done.returncode == 0 else f"failed ({out[-1][:160] if out else done.returncode})"


def stack_run(kind: str, kill_after: float, log_dir: str) -> dict:
    import asyncio

    from services.bench.load import LoadSpec, run_load
    from services.bench.workload import PROMPTS
    from services.mps import MpsDaemon
    from services.stack import Ports, Stack

    replicas = {"llm": 2}
    gpu = ["--device", "cuda"]
    with MpsDaemon() as daemon:
        env = {"llm": {**daemon.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, "vocoder": daemon.env()}
        stack = Stack(Ports.free(replicas), log_dir=log_dir, replicas=replicas, env=env,
                      extra_args={"llm": gpu + ["--preset", "moss-speech", "--kv-cache-gb", "8", "--max-num-seqs", "64"],
                                  "vocoder": gpu + ["--preset", "moss-speech"]})
        with stack:
            spec = LoadSpec(target=stack.target("gateway"), prompts=list(PROMPTS), requests=32 if kind == "sessions" else 96,
                            concurrency=32, ramp=4.0,
                            turns=3 if kind == "sessions" else 0, progress=False)

            async def load():
                task = asyncio.create_task(run_load(spec))
                await asyncio.sleep(kill_after)
                os.kill(stack.procs["llm-2"].pid, signal.SIGKILL)
                records, _ = await task
                return records

            records = asyncio.run(load())
            time.sleep(6)  # (a survivor's idle probe: 5 s)
            alive = {name: stack.procs[name].poll() for name in ("llm", "vocoder")}
    codes: dict[str, int] = {}
    for r in records:
        codes[r.code] = codes.get(r.code, 0) + 1
    logs = {name: open(f"{log_dir}/{name}.log").read() for name in ("llm", "vocoder")}
    return {"calls": codes, **{f"{name} exit code (None: running)": code for name, code in alive.items()},
            **{f"{name} logged a lost GPU": "GPU failed" in text for name, text in logs.items()},
            **{f"{name} logged an illegal memory access": "illegal memory access" in text for name, text in logs.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--busy-seconds", type=float, default=5.0)
    parser.add_argument("--stack", choices=["synthesize", "sessions"])
    parser.add_argument("--kill-after", type=float, default=10.0)
    parser.add_argument("--log-dir", default="/tmp/mps_fault_logs")
    args = parser.parse_args()
    if args.stack:
        events = stack_run(args.stack, args.kill_after, f"{args.log_dir}/{args.stack}")
    else:
        events = bare_clients(args.busy_seconds)
    for what, value in events.items():
        print(f"{args.stack or 'bare clients'}: {what:<45} {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(events, f, indent=1)
    return 0


def bare_clients(busy_seconds: float) -> dict:
    from services.mps import MpsDaemon

    events = {}
    with MpsDaemon() as daemon:
        env = {**os.environ, **daemon.env()}
        a, b = spawn(BUSY, env), spawn(IDLE, env)
        for proc in (a, b):
            assert proc.stdout.readline().strip() == "ready", "a client did not start"
        time.sleep(busy_seconds)
        killed = time.time()
        a.send_signal(signal.SIGKILL)
        a.wait()
        events["A killed"] = 0.0
        events["new client while B holds on"] = new_client(env)
        line = b.stdout.readline().strip()
        if line.startswith("lost"):
            events["B found its context lost after (s)"] = round(float(line.split()[1]) - killed, 2)
        else:
            events["B"] = line
        b.wait(timeout=70)
        events["B exit code"] = b.returncode
        time.sleep(1.0)
        events["new client after B has gone"] = new_client(env)
    return events

if __name__ == "__main__":
    sys.exit(main())
