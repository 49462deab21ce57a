"""Does a Triton kernel that streams the weight beat cuBLAS at the llm's layer products at decode's few rows? (No: equal
alone at its best config, 1.75-2.1x slower under MPS at the llm's 25%: docs/benchmarks.md, stream-matmul-2026-11-30.
It ran inside the engine at commit 295b864, as `bench/llm_engine.py --products stream`.)

The kernel: y = x @ wᵀ for x [M ≤ 64, K] and a bf16 weight w [N, K], each program owning BLOCK_N output columns for
every row and walking K once, so each weight byte is read once and the few rows of x come from L2 (evict-first loads
for the weight). Two forms: DOT (rows padded to BLOCK_M ≥ 16 on the tensor cores) for 2-64 rows; one row on the CUDA
cores into a [BLOCK_N, BLOCK_K] float32 tile summed over K after the loop. Float32 sums, rounded once, as cuBLAS. On
compute capability 9+ it launches while the kernel before still runs (services/common/launch.py). Triton's CPU
interpreter gets bf16 products wrong (tl.dot), so the CPU smoke run is in float32.

Why it was tried: the engine's decode step at batch 1 is 1.46x its roofline, bytes over the copy bandwidth
(roofline-2026-11-29), and the guess was cuBLAS's GEMVs. Here cuBLAS read the fused gate_up weight at ~4.05 TB/s and
the four products at ~3.6 TB/s together, and the kernel did no better.

The study: each timing is a CUDA graph of one product per layer over 36 layers' own weights (random bf16 at the real
size: qkv 6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288; 13.9 GB), so no weight is in L2 when it is read,
as in a decode step. Rows 1-64. Its "floor" column divides the bytes by a copy's bandwidth measured inside a CUDA
graph, which read 2.77 TB/s on an H200 where bench/llm_engine.py's eager copy reads 4.25: that column is not a floor.

  python3 bench/studies/stream_matmul.py --json out.json                  # alone, with a sweep of the kernel's configs
  python3 bench/studies/stream_matmul.py --mps-share 25 --json out.json   # then a child under an MPS daemon at the
                                                                          # llm's share (cuBLAS, default, best config)
  python3 bench/studies/stream_matmul.py --device cpu --layers 2 --rows 1,3 --small --sweep-rows 1,3   # a smoke run

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
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from services.common import launch  # noqa: E402
from services.common.launch import inputs_ready  # noqa: E402


@dataclass(frozen=True)
class StreamConfig:
    block_n: int
    block_k: int
    warps: int
    stages: int


@triton.jit
def _stream_matmul_kernel(x_ptr, w_ptr, y_ptr, M, N, K, x_stride, w_stride, y_stride,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          DOT: tl.constexpr, PDL: tl.constexpr):
    # Program j: y[:, j·BLOCK_N : (j+1)·BLOCK_N] = x [M, K] @ w [BLOCK_N, K]ᵀ. The weight's strip is read with
    # evict-first: each line is used once, and x's rows, read by every program, stay in L2.
    inputs_ready(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    col_ok = cols[:, None] < N
    w_rows = w_ptr + cols[:, None].to(tl.int64) * w_stride
    if DOT:
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows[:, None] < M
        x_rows = x_ptr + rows[:, None].to(tl.int64) * x_stride
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            k_ok = (k + ks)[None, :] < K
            x = tl.load(x_rows + k + ks[None, :], mask=row_ok & k_ok, other=0.0)
            w = tl.load(w_rows + k + ks[None, :], mask=col_ok & k_ok, other=0.0, eviction_policy="evict_first")
            acc = tl.dot(x, tl.trans(w), acc)
        tl.store(y_ptr + rows[:, None].to(tl.int64) * y_stride + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=row_ok & (cols[None, :] < N))
    else:
        # One row: tile [BLOCK_N, BLOCK_K] of products, summed over K after the loop.
        tile = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            k_ok = (k + ks) < K
            x = tl.load(x_ptr + k + ks, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_rows + k + ks[None, :], mask=col_ok & k_ok[None, :], other=0.0,
                        eviction_policy="evict_first")
            tile += w.to(tl.float32) * x[None, :]
        tl.store(y_ptr + cols, tl.sum(tile, axis=1).to(y_ptr.dtype.element_ty), mask=cols < N)


# Rows up to this many go through the kernel (decode steps and short prefills); more rows make a product whose
# FLOPs, not its bytes, set its time, and cuBLAS's tiles are the better there.
STREAM_ROWS = 64


def default_config(m: int, n: int, k: int) -> StreamConfig:
    """The config for an [m, k] @ [n, k]ᵀ product: enough programs to keep every multiprocessor's loads in flight
    (≥ 2 a multiprocessor at N = 4096) with each strip walked in 16 KB steps."""
    block_n = 16 if n <= 8192 else 64
    if m == 1:
        return StreamConfig(block_n=block_n, block_k=512 if block_n == 16 else 128, warps=4, stages=1)
    return StreamConfig(block_n=block_n, block_k=256 if block_n == 16 else 128, warps=4, stages=4)


def stream_matmul(x: torch.Tensor, w: torch.Tensor, config: StreamConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (M ≤ STREAM_ROWS), w [N, K] (both with a contiguous last dim, one dtype) → y [M, N] = x @ wᵀ in x's
    dtype. Grid and arguments depend only on shapes: capturable in a CUDA graph."""
    assert x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1], (x.shape, w.shape)
    assert x.stride(-1) == 1 and w.stride(-1) == 1 and x.dtype == w.dtype
    m, k = x.shape
    n = w.shape[0]
    assert m <= STREAM_ROWS, f"{m} rows: stream_matmul is for up to {STREAM_ROWS}"
    cfg = config or default_config(m, n, k)
    y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
    dot = m > 1
    _stream_matmul_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=max(16, triton.next_power_of_2(m)) if dot else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        DOT=dot, PDL=(pdl := launch.pdl(x)), launch_pdl=pdl, num_warps=cfg.warps, num_stages=cfg.stages)
    return y

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
