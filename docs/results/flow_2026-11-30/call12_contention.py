"""What a vocoder's start waits for beside an llm's (the fate-shared restart's long pole).

After a fault every GPU stage starts at once. In call 10 the vocoder's "flow moved to cuda" took 5.5-7.9 s each time,
and each time it ended within ~1 s of the llm's "the weights took 5.3-8.7 s"; at the cold start, when the llm's weights
were already in, the same move took 0.4 s. This script starts the two steps side by side in two fresh processes, each
with its CUDA context made first and both released together, alone and together, under MPS and without:

- vocoder: the 'moss-speech' codec's flow built on the CPU (as a spare reads it ahead), then `.to(cuda, bfloat16)`,
  with the time each parameter's move ended (to tell "stalled, then fast" from "slow throughout");
- llm: `random_model(preset('moss-speech'))` on cuda (as the server builds it), and, to tell allocation from
  initialisation, the same parameters' shapes only allocated (`torch.empty`), and allocated as one flat buffer.

    python3 docs/results/flow_2026-11-30/call12_contention.py   # prints a table last, writes $OUT/call12.json

Run 2026-11-30 06:16 UTC without the "context" rows and column (its table is in docs/benchmarks.md), and again at 06:20
UTC as it is (call13.sh). Predicted for the first run (written 06:15 UTC, before the run): the flow's move alone ~0.3 s, the llm's
build alone 4-5 s; side by side under MPS the move takes 4-6 s, most of it one wait (stalled while the llm allocates);
the llm's shapes allocated alone take most of its 4-5 s, one flat buffer under 1 s, and the move beside that flat
buffer ~0.4 s. Without MPS: not predicted (no basis). For the second
(written 06:18 UTC): three contexts made at once as the first clients of a fresh MPS daemon (its server started for
them) 3-5 s each, against a running server ~0.5-1 s each, and ~0.3-0.5 s without MPS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]


def child(role: str) -> None:
    import torch

    if role == "vocoder":
        from services.vocoder.codec import checkpoint, config
        flow = checkpoint.random_codec(config.PRESETS["moss-speech"](), 0)[0]
    elif role in ("llm-empty", "llm-flat"):
        from services.llm.model.config import preset
        from services.llm.model.model import MossSpeechForCausalLM
        with torch.device("meta"):
            shapes = [p.shape for p in MossSpeechForCausalLM(preset("moss-speech")).parameters()]
    t0 = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()  # the context made before the clock starts
    print(f"ready {time.perf_counter() - t0:.3f}", flush=True)
    if role == "context":
        sys.stdin.readline()
        print(json.dumps({"role": role, "seconds": 0.0, "params": 0, "segments": 0, "largest_gaps": []}), flush=True)
        return
    sys.stdin.readline()  # go
    t0 = time.perf_counter()
    marks = []
    if role == "vocoder":
        for p in flow.parameters():
            p.data = p.data.to(device="cuda", dtype=torch.bfloat16)
            torch.cuda.synchronize()
            marks.append(time.perf_counter() - t0)
        n = sum(p.numel() for p in flow.parameters())
    elif role == "llm":
        from services.llm.model.checkpoint import random_model
        from services.llm.model.config import preset
        model = random_model(preset("moss-speech"), device="cuda", dtype=torch.bfloat16)
        n = sum(p.numel() for p in model.parameters())
    elif role == "llm-empty":
        kept = [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
        n = sum(t.numel() for t in kept)
    else:  # llm-flat
        n = sum(s.numel() for s in shapes)
        flat = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        flat.normal_()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    stats = torch.cuda.memory_stats()
    gaps = sorted((b - a for a, b in zip([0.0] + marks, marks)), reverse=True)[:3]
    print(json.dumps({"role": role, "seconds": round(seconds, 3), "params": n,
                      "segments": stats.get("segment.all.allocated", 0), "largest_gaps": [round(g, 3) for g in gaps]}),
          flush=True)


def run(roles: list[str], env: dict) -> list[dict]:
    procs = [subprocess.Popen([sys.executable, __file__, "--child", r], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env) for r in roles]
    contexts = []
    for p in procs:
        word, seconds = p.stdout.readline().split()
        assert word == "ready"
        contexts.append(float(seconds))
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = [{**json.loads(p.stdout.readline()), "context_s": c} for p, c in zip(procs, contexts)]
    for p in procs:
        p.wait()
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    from services.mps import MpsDaemon
    scenarios = [["context", "context", "context"], ["context", "context", "context"], ["vocoder"], ["llm"],
                 ["vocoder", "llm"], ["llm-empty"], ["vocoder", "llm-empty"], ["llm-flat"], ["vocoder", "llm-flat"]]
    rows = []
    for mps in (True, False):
        daemon = MpsDaemon() if mps else None
        env = {**os.environ, **(daemon.env() if daemon else {})}
        if daemon:
            daemon.start()
        try:
            for roles in scenarios if mps else scenarios[:5]:
                for r in run(roles, env):
                    rows.append({"mps": mps, "beside": "+".join(x for x in roles if x != r["role"]) or "-", **r})
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            if daemon:
                daemon.stop()
    Path(os.environ.get("OUT", "/tmp/out"), "call12.json").write_text(json.dumps(rows, indent=1))
    print("\n| mps | step | beside | context s | s | params | segments | longest waits between parameters |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {'on' if r['mps'] else 'off'} | {r['role']} | {r['beside']} | {r['context_s']:.2f} | {r['seconds']:.2f} | "
              f"{r['params'] / 1e9:.3f} B | {r['segments']} | {r['largest_gaps']} |")


if __name__ == "__main__":
    main()
