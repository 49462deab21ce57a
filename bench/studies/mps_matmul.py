"""Are bf16 matrix products right in a CUDA MPS client capped to a share of the GPU? On an H100 cuBLAS's came
out wrong at several shares, which made the llm fail every request with non-finite logits at --mps-llm-threads 35
and 45. For each share: an MPS daemon of this script's own, a child process as its client with
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set, running the GPU services' start-up check (services/common/matmul_check.py);
then the same without MPS. Prints a table and writes JSON.

    python3 bench/studies/mps_matmul.py --shares 10,20,25,30,33,35,40,45,50,55,60,75,100 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHILD = """
import json, time, torch
from services.common.matmul_check import MatmulFault, check_matmul
sms = torch.cuda.get_device_properties(0).multi_processor_count
t = time.perf_counter()
try:
    n = check_matmul("cuda")
    out = {"sms": sms, "right": True, "checked": n}
except MatmulFault as e:
    out = {"sms": sms, "right": False, "message": str(e)}
out["seconds"] = time.perf_counter() - t
print(json.dumps(out))
"""


def child(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    from services.mps import MpsDaemon

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shares", default="10,20,25,30,33,35,40,45,50,55,60,75,100")
    p.add_argument("--json")
    args = p.parse_args()
    rows = {}
    with MpsDaemon() as mps:
        for share in (int(x) for x in args.shares.split(",")):
            rows[f"{share}%"] = child({**mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share)})
    rows["no MPS"] = child({})
    print("\n| MPS share | SMs visible | bf16 products | check took |")
    print("| --- | --- | --- | --- |")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | - | error: {r['error']} | - |")
            continue
        verdict = "right" if r["right"] else r["message"].split(": ", 1)[1].split(". Under")[0]
        print(f"| {name} | {r['sms']} | {verdict} | {r['seconds'] * 1e3:.0f} ms |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
