"""What slows the vocoder beside the llm: loads that stand in for the llm's decode steps, one property at
a time, for `bench/studies/gpu_sharing.py --neighbors`.

Beside the llm (MPS, the llm at 25%) the vocoder's flow calls run at ~0.45 of their speed alone. A flow call is
~6,000 small kernels (products of 3-6 us, per-frame kernels of ~2.5 us) over the estimator's 143 MB of weights and a
few MB of activations; a decode step of the llm streams ~14 GB of weights through L2 from its quarter of the
multiprocessors. Each neighbor below keeps one of the step's properties and drops the others:

- read: streams a 2 GiB buffer from HBM as fast as its share allows (bandwidth, and L2 filled with lines used once);
- read-evict-first: the same loads marked evict-first, so that they leave L2's other lines in place;
- spin: arithmetic in registers, no memory (multiprocessors occupied, nothing else);
- llm-triton / llm-triton-evict-first: the llm itself, its decode products (up to 64 rows) in a Triton kernel that
  streams the bf16 weight, its loads plain or evict-first (the same arithmetic as cuBLAS's bf16 product).
"""

from __future__ import annotations

import time

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from services.llm.runner.kernels.fp8 import decode_configs


@triton.jit
def _read_kernel(src_ptr, out_ptr, n, per_program, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    # Program p sums src[p·per_program : (p+1)·per_program] (its sum stored, so that no load can be dropped).
    start = tl.program_id(0).to(tl.int64) * per_program
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(0, per_program, BLOCK):
        idx = start + i + offs
        acc += tl.load(src_ptr + idx, mask=idx < n, other=0.0, eviction_policy=EVICT).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


@triton.jit
def _spin_kernel(out_ptr, iters, BLOCK: tl.constexpr):
    # Fused multiply-adds on registers only: a multiprocessor kept busy without touching memory.
    x = tl.arange(0, BLOCK).to(tl.float32) * 1e-3
    for _ in range(iters):
        x = x * 0.999 + 1e-4
        x = x * 1.001 - 1e-4
    tl.store(out_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), x)


def launch_loop(once, device: torch.device, seconds: float, name: str) -> dict:
    """once() launched back to back for `seconds` (in the llm's place: "steps"); ms is one launch's share."""
    launches, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        once()
        launches += 1
        if launches % 8 == 0:
            torch.cuda.synchronize(device)  # keep the queue short: the loop ends when told
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    return {"loop": "llm", "neighbor": name, "steps": launches, "seconds": wall, "ms": wall / launches * 1e3}


class ReadLoop:
    """Passes over a 2 GiB bf16 buffer, back to back; ms is one pass."""

    def __init__(self, device: torch.device, evict: str, gib: float = 2.0):
        self.src = torch.ones(int(gib * (1 << 30)) // 2, dtype=torch.bfloat16, device=device)
        self.programs = torch.cuda.get_device_properties(device).multi_processor_count * 8
        self.per_program = triton.cdiv(triton.cdiv(self.src.numel(), self.programs), 4096) * 4096
        self.out = torch.empty(self.programs, dtype=torch.float32, device=device)
        self.evict, self.device = evict, device

    def once(self) -> None:
        _read_kernel[(self.programs,)](self.src, self.out, self.src.numel(), self.per_program, BLOCK=4096,
                                       EVICT=self.evict, num_warps=8)

    def prepare(self) -> None:
        self.once()
        torch.cuda.synchronize(self.device)

    def run(self, seconds: float) -> dict:
        out = launch_loop(self.once, self.device, seconds, f"read {self.evict or 'plain'}")
        return {**out, "tb_per_s": out["steps"] * self.src.numel() * 2 / out["seconds"] / 1e12}


class SpinLoop:
    """Register arithmetic on every multiprocessor the share allows; ms is one launch (~1 ms alone on an H100)."""

    def __init__(self, device: torch.device, iters: int = 20_000):
        self.programs = torch.cuda.get_device_properties(device).multi_processor_count * 4
        self.out = torch.empty(self.programs * 1024, dtype=torch.float32, device=device)
        self.iters, self.device = iters, device

    def once(self) -> None:
        _spin_kernel[(self.programs,)](self.out, self.iters, BLOCK=1024, num_warps=8)

    prepare = ReadLoop.prepare

    def run(self, seconds: float) -> dict:
        return launch_loop(self.once, self.device, seconds, "spin")


# ---- the llm's decode products in Triton, their weight loads plain or evict-first -------------------------------

@triton.autotune(configs=decode_configs(), key=["N", "K", "BLOCK_M", "EVICT"])  # the FP8 decode kernel's space
@triton.jit
def _decode_bf16_kernel(x_ptr, w_ptr, y_ptr, M, N, K, x_stride, w_stride, y_stride,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVICT: tl.constexpr):
    # Program j: y[:, j·BLOCK_N : (j+1)·BLOCK_N] = x [M, K] @ w [BLOCK_N, K]ᵀ, bf16 in, float32 sums; the weight's
    # strip is read once, with the eviction policy EVICT; x (a few rows) stays in L2 for every program.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * x_stride
    w_rows = w_ptr + cols[:, None].to(tl.int64) * w_stride
    row_ok, col_ok = rows[:, None] < M, cols[:, None] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_ok = (k + ks)[None, :] < K
        x = tl.load(x_rows + k + ks[None, :], mask=row_ok & k_ok, other=0.0)
        w = tl.load(w_rows + k + ks[None, :], mask=col_ok & k_ok, other=0.0, eviction_policy=EVICT)
        acc = tl.dot(x, tl.trans(w), acc)
    tl.store(y_ptr + rows[:, None].to(tl.int64) * y_stride + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok & (cols[None, :] < N))


def triton_linear(evict: str):
    """→ a stand-in for runner/fp8.py's `linear` on bf16 weights: up to 64 rows through the Triton kernel above."""
    def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda or x.shape[0] > 64 or x.stride(-1) != 1 or weight.stride(-1) != 1:
            return F.linear(x, weight)
        m, k = x.shape
        n = weight.shape[0]
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        _decode_bf16_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
            x, weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
            BLOCK_M=max(16, triton.next_power_of_2(m)), EVICT=evict)
        return y
    return linear


def check_triton_linear(device: torch.device) -> float:
    """The stand-in against F.linear at a decode product's shape: → the largest difference over the output's scale."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(32, 4096, device=device, dtype=torch.bfloat16, generator=g)
    w = torch.randn(6144, 4096, device=device, dtype=torch.bfloat16, generator=g) * 0.02
    ref = F.linear(x, w).float()
    worst = max(float((triton_linear(e)(x, w).float() - ref).abs().max()) for e in ("", "evict_first"))
    return worst / float(ref.abs().max())


def patch_llm_products(neighbor: str, device: torch.device) -> None:
    """For the llm-triton neighbors: the forward's layer products through triton_linear (before the engine's graphs
    are captured); checked against F.linear first."""
    import services.llm.runner.forward as forward

    error = check_triton_linear(device)
    if error > 0.02:
        raise SystemExit(f"the Triton decode product is off by {error:.3f} of its scale")
    forward.linear = triton_linear("evict_first" if neighbor.endswith("evict-first") else "")


# ---- which multiprocessors a process's kernels run on -----------------------------------------------------------

@triton.jit
def _sm_id_kernel(out_ptr, iters):
    # Each program writes the id of the multiprocessor it ran on, after spinning a little so that the programs spread.
    x = tl.program_id(0).to(tl.float32)
    for _ in range(iters):
        x = x * 0.999 + 1e-4
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(out_ptr + tl.program_id(0), sm + (x < -1.0).to(tl.int32))


def sm_ids(device: torch.device, programs: int = 4096) -> list[int]:
    """The multiprocessors this process's kernels may run on, as seen by many small programs (%smid: under MPS it
    numbers them within the client's context, so two clients' lists can be compared by length only)."""
    out = torch.full((programs,), -1, dtype=torch.int32, device=device)
    _sm_id_kernel[(programs,)](out, 2000, num_warps=1)
    return sorted(set(out.tolist()))
