"""The llm's layer products at decode's few rows: cuBLAS (F.linear) against the weight-streaming Triton kernel
(services/llm/runner/kernels/stream_matmul.py) and against reading the weights at the copy bandwidth, side by side.

Each timing is a CUDA graph of one product per layer over 36 layers' own weights (random bf16 at the real size:
qkv 6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288; 13.9 GB), so no weight is in L2 when it is read,
as in a decode step. Rows 1-64; the roofline of a product is its weight's bytes over the copy bandwidth (read +
written, as bench/llm_engine.py counts it).

  python3 bench/stream_matmul.py --json out.json                  # alone, with a sweep of the kernel's configs
  python3 bench/stream_matmul.py --mps-share 25 --json out.json   # the same, then a child under an MPS daemon at
                                                                  # the llm's share in the stack (cuBLAS, the default
                                                                  # config and the sweep's best)
  python3 bench/stream_matmul.py --device cpu --layers 2 --rows 1,3 --small   # a smoke run (Triton's interpreter)

First the kernel against a float32 product (and cuBLAS's error beside it); then per row count the whole layer
chain (4 x 36 products) and per shape each config; the table last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from services.llm.runner.kernels.stream_matmul import StreamConfig, stream_matmul  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
SMALL = {"qkv": (96, 64), "o": (64, 64), "gate_up": (256, 64), "down": (64, 192)}


def sweep_configs(rows: int) -> list[StreamConfig]:
    out = []
    for bn, bk, warps, stages in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (1, 2, 4)):
        if rows == 1 and bn * bk > 16384:  # the one-row form's float32 tile: more would spill its registers
            continue
        if rows > 1 and stages == 1:
            continue
        out.append(StreamConfig(bn, bk, warps, stages))
    return out


def log(msg: str) -> None:
    print(msg, flush=True)


def chain_ms(products, device, reps: int = 7) -> float:
    """Median ms of one replay of a graph of every (fn, x, w) product."""
    def run():
        for fn, x, w in products:
            fn(x, w)
    if device.type != "cuda":
        t = time.perf_counter()
        run()
        return (time.perf_counter() - t) * 1e3
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return statistics.median(out)


def copy_bandwidth(device) -> float:
    if device.type != "cuda":
        return float("nan")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = chain_ms([(lambda a, b: b.copy_(a), src, dst)] * 10, device) / 10
    return 2 * src.numel() / (ms / 1e3)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--sweep-rows", default="1,16,64", help="row counts whose configs are swept, per shape")
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--configs", help="a JSON of {shape: {rows: config}} to time beside the default (the child)")
    p.add_argument("--mps-share", type=int, help="then the same, cuBLAS / default / best, in a child under MPS at it")
    p.add_argument("--small", action="store_true", help="small shapes (a CPU smoke run)")
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the interpreter's tl.dot takes no bf16
    rows_list = [int(r) for r in args.rows.split(",")]
    shapes = SMALL if args.small else SHAPES
    under = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    result = {"argv": sys.argv, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "mps_share": under,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "layers": args.layers, "check": {}, "chain": {}, "sweep": {}}
    log(f"{result['gpu']}, torch {torch.__version__}, MPS share {under or '-'}")
    bw = copy_bandwidth(device)
    result["copy_bandwidth_bytes_per_s"] = bw
    log(f"copy bandwidth {bw / 1e12:.3f} TB/s (read + write)")

    g = torch.Generator(device=device).manual_seed(0)
    weights = {name: [torch.randn(n, k, device=device, dtype=dtype, generator=g) * 0.02 for _ in range(args.layers)]
               for name, (n, k) in shapes.items()}
    bytes_of = {name: sum(w.numel() * w.element_size() for w in ws) for name, ws in weights.items()}
    best = {}
    if args.configs:
        best = {s: {int(r): StreamConfig(**c) for r, c in by.items()} for s, by in json.loads(Path(args.configs).read_text()).items()}

    # ---- the kernel against float32, cuBLAS's error beside it
    worst = 0.0
    for name, ws in weights.items():
        for m in rows_list:
            x = torch.randn(m, ws[0].shape[1], device=device, dtype=dtype, generator=g)
            want = x.float() @ ws[0].float().t()
            ours, theirs = relative_error(stream_matmul(x, ws[0]), want), relative_error(F.linear(x, ws[0]), want)
            result["check"][f"{name} {m}"] = {"stream": ours, "cublas": theirs}
            worst = max(worst, ours / max(theirs, 1e-6))
            if ours > 1e-2:
                log(f"WRONG: {name} at {m} rows: relative error {ours:.2e} (cuBLAS {theirs:.2e})")
                return 1
    log(f"check: every shape and row count within 1e-2 of float32; worst against cuBLAS's own error {worst:.2f}x")

    def chain(m, how):
        xs = {k: torch.randn(m, k, device=device, dtype=dtype, generator=g) for k in {w.shape[1] for w in weights["o"] + weights["down"]}}
        products = []
        for layer in range(args.layers):
            for name in shapes:
                w = weights[name][layer]
                fn = how(name, m)
                products.append((fn, xs[w.shape[1]], w))
        return chain_ms(products, device)

    total_bytes = sum(bytes_of.values())
    floor_ms = total_bytes / bw * 1e3
    cublas_fn = lambda name, m: F.linear  # noqa: E731
    default_fn = lambda name, m: stream_matmul  # noqa: E731

    def best_fn(name, m):
        by = best.get(name, {})
        if not by:
            return stream_matmul
        nearest = min(by, key=lambda r: (abs(r - m) if (r == 1) == (m == 1) else 1 << 20, r))
        cfg = by[nearest]
        return lambda x, w: stream_matmul(x, w, cfg)

    # ---- per shape: every config (alone only; the child times the parent's best)
    if not args.no_sweep and not under:
        for name, ws in weights.items():
            for m in [int(r) for r in args.sweep_rows.split(",")]:
                x = torch.randn(m, ws[0].shape[1], device=device, dtype=dtype, generator=g)
                cells = []
                for cfg in sweep_configs(m):
                    try:
                        ms = chain_ms([(lambda a, b, c=cfg: stream_matmul(a, b, c), x, w) for w in ws], device)
                    except Exception as e:  # a config that does not compile (resources): noted, not fatal
                        log(f"  {name} {m} rows {cfg}: {type(e).__name__}")
                        continue
                    cells.append((ms, cfg))
                cells.sort(key=lambda c: c[0])
                cublas = chain_ms([(F.linear, x, w) for w in ws], device)
                top = cells[0]
                best.setdefault(name, {})[m] = top[1]
                result["sweep"][f"{name} {m}"] = {"cublas_ms": cublas, "floor_ms": bytes_of[name] / bw * 1e3,
                                                  "best": [{"ms": ms, **vars(c)} for ms, c in cells[:5]],
                                                  "default_ms": chain_ms([(stream_matmul, x, w) for w in ws], device)}
                log(f"  {name:7} {m:3} rows: cuBLAS {cublas:.3f} ms, default {result['sweep'][f'{name} {m}']['default_ms']:.3f}, "
                    f"best {top[0]:.3f} {vars(top[1])}, floor {bytes_of[name] / bw * 1e3:.3f} ms ({args.layers} layers)")

    for m in rows_list:
        cell = {"cublas_ms": chain(m, cublas_fn), "default_ms": chain(m, default_fn), "floor_ms": floor_ms}
        if best:
            cell["best_ms"] = chain(m, best_fn)
        result["chain"][m] = cell
        log(f"chain {m:3} rows: " + ", ".join(f"{k} {v:.3f}" for k, v in cell.items()))

    log(f"\nthe layer products of a decode step ({args.layers} layers, {total_bytes / 1e9:.2f} GB), "
        f"{result['gpu']}, MPS share {under or '-'}")
    log("rows  cuBLAS ms  x roofline  stream ms  x roofline  best ms  x roofline  stream / cuBLAS")
    for m, c in result["chain"].items():
        b = c.get("best_ms", float("nan"))
        log(f"{m:4}  {c['cublas_ms']:9.3f}  {c['cublas_ms'] / floor_ms:10.2f}  {c['default_ms']:9.3f}  "
            f"{c['default_ms'] / floor_ms:10.2f}  {b:7.3f}  {b / floor_ms:10.2f}  {min(c['default_ms'], b) / c['cublas_ms']:14.2f}")
    result["best_configs"] = {s: {r: vars(c) for r, c in by.items()} for s, by in best.items()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))

    if args.mps_share and not under:
        del weights
        torch.cuda.empty_cache()
        from services.mps import MpsDaemon

        configs = Path(args.json or "/tmp/stream_matmul.json").with_suffix(".configs.json")
        configs.write_text(json.dumps(result["best_configs"]))
        child = [sys.executable, __file__, "--rows", args.rows, "--layers", str(args.layers), "--no-sweep",
                 "--configs", str(configs)] + (["--json", str(Path(args.json).with_suffix(".mps.json"))] if args.json else [])
        with MpsDaemon() as mps:
            env = {**os.environ, **mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(args.mps_share)}
            return subprocess.run(child, env=env).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
