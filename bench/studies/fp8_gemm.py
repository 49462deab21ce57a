"""The llm's decode products in each arithmetic, alone and in a CUDA MPS client at the llm's share: what
`--quantization fp8` can gain where the llm really runs, beside the vocoder on a quarter of the multiprocessors.

For each setting (no MPS; MPS at each --shares), a child process holds 4 layers of the real model's four products
(qkv 6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288), cycled over 36 layers (the audio path), and
replays them from one CUDA graph at each row count, in each arithmetic:
  bf16          F.linear (cuBLAS), the default;
  fp8 cublaslt  the rows quantized (Triton), torch._scaled_mm with row-wise scales (what prefill uses);
  fp8 decode    the rows quantized, kernels/fp8.py's decode kernel (what decode uses).
The floor: the weight bytes read once at the copy bandwidth measured in the same process. Prints a table, writes JSON.

    python3 bench/studies/fp8_gemm.py --shares 25 [--rows 1,16,32,64] [--json out.json]
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

CHILD = r"""
import json, statistics, sys, torch, torch.nn.functional as F
from llm_floor import copy_bandwidth
from measure import times
from services.llm.runner import fp8
from services.llm.runner.kernels.fp8 import decode_matmul, quantize_rows
rows_list = json.loads(sys.argv[1])
dev = torch.device("cuda")
SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]
LAYERS, HELD = 36, 4
torch.manual_seed(0)
dense = [[torch.randn(n, k, device=dev, dtype=torch.bfloat16) / 64 for n, k in SHAPES] for _ in range(HELD)]
quant = [[fp8.Fp8Weight.of(w) for w in layer] for layer in dense]
bw = copy_bandwidth(dev)
nbytes = {"bf16": sum(n * k * 2 for n, k in SHAPES) * LAYERS, "fp8": sum(n * k for n, k in SHAPES) * LAYERS}

def cublaslt(x, w):
    q, s = quantize_rows(x)
    return torch._scaled_mm(q, w.data.t(), scale_a=s, scale_b=w.scale, out_dtype=x.dtype)

VARIANTS = {
    "bf16": (dense, F.linear),
    "fp8 cublaslt": (quant, cublaslt),
    "fp8 decode": (quant, lambda x, w: decode_matmul(*quantize_rows(x), w.data, w.scale, x.dtype)),
}
out = {"sms": torch.cuda.get_device_properties(0).multi_processor_count, "copy_bandwidth": bw, "ms": {}, "floor_ms": {}}
for name, (weights, product) in VARIANTS.items():
    for m in rows_list:
        xs = {k: torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _, k in SHAPES}
        def run():
            for layer in range(LAYERS):
                for w, (_, k) in zip(weights[layer % HELD], SHAPES):
                    product(xs[k], w)
        with torch.inference_mode():
            run()  # compiles and tunes outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            ms = statistics.median(times(graph.replay, 15, dev)) * 1e3
        out["ms"][f"{name}|{m}"] = ms
        out["floor_ms"][f"{name}|{m}"] = nbytes["bf16" if name == "bf16" else "fp8"] / bw * 1e3
        del graph
print(json.dumps(out))
"""


def child(rows: list[int], env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(rows)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=400, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shares", default="25", help="MPS active-thread percentages to run under (besides no MPS)")
    ap.add_argument("--rows", default="1,16,32,64")
    ap.add_argument("--json")
    args = ap.parse_args()
    from services.mps import MpsDaemon

    rows = [int(r) for r in args.rows.split(",")]
    results = {"no MPS": child(rows, {})}
    with MpsDaemon() as mps:
        for share in (s for s in args.shares.split(",") if s):
            results[f"MPS {share}%"] = child(rows, {**mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": share})
    variants = list(dict.fromkeys(key.split("|")[0] for key in results["no MPS"]["ms"]))
    print(f"{'36 layers x 4 products (ms)':34s}" + "".join(f"{f'{r} rows':>10s}" for r in rows))
    for setting, res in results.items():
        print(f"-- {setting}: {res['sms']} SMs, copy {res['copy_bandwidth'] / 1e12:.2f} TB/s")
        for v in variants:
            cells = "".join(f"{res['ms'][f'{v}|{r}']:10.2f}" for r in rows)
            print(f"   {v:31s}{cells}   (floor {res['floor_ms'][f'{v}|{rows[0]}']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
