"""Whether a new GPU process's allocations wait for a dead one's memory to be given back.

Call 13: after a fault the llm's random weights took 7.0-7.4 s in the server (0.1 s in a fresh process beside nothing)
and the vocoder's flow move 5.8-6.4 s (0.15 s), with every CUDA context made in under 0.05 s. The processes that had
just died held ~60 GB. Here, under an MPS daemon as `moss-serve up` runs one: a process holds 60 GB; it is SIGKILLed
(or faulted on purpose, as bench/gpu_fault.py does, and then exits); a fresh process made at once builds the llm's
random weights and moves the codec's flow, each step timed. Baseline: the same fresh process with nothing before it.

    python3 docs/results/flow_2026-11-30/call14_teardown.py   # a table last, $OUT/call14.json

Run 2026-11-30 06:27 UTC. Predicted (written 06:26 UTC, before the run): after a kill or a fault the weights take 4-7 s
and the move several seconds (waiting for the 60 GB to be given back), against ~0.1 s and ~0.2 s after nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]


def holder(fault: bool) -> None:
    import torch

    held = torch.empty(60 << 30, dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    print("ready", flush=True)
    sys.stdin.readline()
    if fault:
        sys.path.insert(0, str(ROOT / "bench"))
        from gpu_fault import fault as store_far
        try:
            store_far()
        except Exception as e:  # noqa: BLE001  the point
            print(f"faulted: {type(e).__name__}", file=sys.stderr, flush=True)
        os._exit(3)
    time.sleep(600)


def starter() -> None:
    import torch

    from services.llm.model.checkpoint import random_model
    from services.llm.model.config import preset
    from services.vocoder.codec import checkpoint, config
    flow = checkpoint.random_codec(config.PRESETS["moss-speech"](), 0)[0]
    print("ready", flush=True)
    sys.stdin.readline()
    t = [time.perf_counter()]
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t.append(time.perf_counter())
    model = random_model(preset("moss-speech"), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t.append(time.perf_counter())
    flow.to(device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t.append(time.perf_counter())
    del model
    print(json.dumps({"context_s": round(t[1] - t[0], 3), "weights_s": round(t[2] - t[1], 3),
                      "flow_s": round(t[3] - t[2], 3)}), flush=True)


def spawn(*args: str, env: dict) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=env)
    assert p.stdout.readline().strip() == "ready"
    return p


def go(p: subprocess.Popen) -> None:
    p.stdin.write("go\n")
    p.stdin.flush()


def scenario(before: str, env: dict) -> dict:
    start = spawn("--starter", env=env)
    hold = spawn("--holder", "fault" if before == "fault" else "kill", env=env) if before != "nothing" else None
    released = time.perf_counter()
    if before == "kill":
        hold.send_signal(signal.SIGKILL)
        hold.wait()
    elif before == "fault":
        go(hold)
        hold.wait()
    if before != "nothing":
        released = time.perf_counter()
        # As `moss-serve up` after a fault: the starter made its context before the fault (its CUDA untouched until
        # now, as a spare's), so it goes once the holder is gone.
    go(start)
    row = {"before": before, **json.loads(start.stdout.readline()), "after_release_s": round(time.perf_counter() - released, 3)}
    start.wait()
    return row


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--holder":
        return holder(sys.argv[2] == "fault")
    if len(sys.argv) >= 2 and sys.argv[1] == "--starter":
        return starter()
    from services.mps import MpsDaemon
    rows = []
    with MpsDaemon() as daemon:
        env = {**os.environ, **daemon.env()}
        for before in ("nothing", "kill", "fault", "nothing", "kill", "fault"):
            rows.append(scenario(before, env))
            print(json.dumps(rows[-1]), flush=True)
    Path(os.environ.get("OUT", "/tmp/out"), "call14.json").write_text(json.dumps(rows, indent=1))
    print("\n| before | context s | llm weights s | flow move s |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['before']} | {r['context_s']:.2f} | {r['weights_s']:.2f} | {r['flow_s']:.2f} |")


if __name__ == "__main__":
    main()
