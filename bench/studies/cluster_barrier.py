"""What a step costs a kernel that owns a stream's rows on a thread-block cluster (Hopper's distributed shared memory
and cluster barrier) against one that spans the grid (a global-memory barrier), on one GPU. The persistent
estimator's grid barrier cost 1.76 us at 132 programs (docs/benchmarks.md), about a kernel boundary's cost. A
cluster's barrier is the hardware's, among at most 16 multiprocessors.

    python bench/studies/cluster_barrier.py --json out.json

CUDA C++ compiled at run time (NVRTC, through torch.cuda._compile_kernel: no compiler to install). Each kernel runs
N steps; a step's cost is the difference between N and 0 steps over N, median of several launches:
- cluster barrier (`barrier.cluster.arrive/wait`) at clusters of 2, 4, 8 and 16 blocks, one cluster and as many as fit;
- the same with a distributed-shared-memory exchange a step: each block writes a word, the barrier, each reads its
  neighbour's (`mapa` + `ld.shared::cluster`), the barrier (what a split product's partial sums would cost);
- a grid barrier of all blocks in global memory (counter and generation word, as megakernel.py's), at 132 blocks.
Prints a table; writes JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch

from measure import gpu_record

SOURCE = r"""
extern "C" __global__ void __cluster_dims__(CS, 1, 1) cluster_steps(int n, int exchange, int* out) {
  __shared__ int word;
  unsigned int rank, size;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
  int acc = 0;
  for (int i = 0; i < n; ++i) {
    if (exchange) {
      if (threadIdx.x == 0) word = i + (int)rank;
      asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
      unsigned int local, remote, value;
      asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(local) : "l"(&word));
      unsigned int peer = (rank + 1) % size;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(peer));
      asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(value) : "r"(remote) : "memory");
      acc += (int)value;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  }
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}
"""

GRID_SOURCE = r"""
extern "C" __global__ void grid_steps(int n, unsigned int* count, volatile unsigned int* gen, int* out) {
  for (int i = 0; i < n; ++i) {
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned int g = *gen;
      __threadfence();
      if (atomicAdd(count, 1u) == gridDim.x - 1) {
        atomicExch(count, 0u);
        __threadfence();
        atomicAdd((unsigned int*)gen, 1u);
      } else {
        while (*gen == g) { }
      }
      __threadfence();
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = n;
}
"""


def allow_large_clusters(kernel) -> bool:
    """Clusters of 16 blocks are non-portable: the function must allow them
    (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 14)."""
    func = getattr(kernel, "func", None)
    if func is None:
        return False
    libcuda = torch.cuda._utils._get_gpu_runtime_library()
    return libcuda.cuFuncSetAttribute(func, ctypes.c_int(14), ctypes.c_int(1)) == 0


def per_step_us(launch, steps: int = 2000, reps: int = 7) -> float:
    """Microseconds a step: (N steps - 0 steps) / N, each the median of reps launches timed with events."""
    def timed(n):
        out = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch(n)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        return statistics.median(out)

    launch(10)
    torch.cuda.synchronize()
    return (timed(steps) - timed(0)) / steps


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    args = p.parse_args()
    out = gpu_record()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = torch.zeros(1024, dtype=torch.int32, device="cuda")
    for cs in (2, 4, 8, 16):
        kernel = torch.cuda._compile_kernel(SOURCE.replace("CS", str(cs)), "cluster_steps")
        if cs > 8 and not allow_large_clusters(kernel):
            print(f"clusters of {cs}: the function could not be allowed a non-portable size; skipped", flush=True)
            continue
        for clusters in (1, sms // cs):
            for exchange in (0, 1):
                try:
                    us = per_step_us(lambda n: kernel(grid=(cs * clusters, 1, 1), block=(128, 1, 1),
                                                      args=[n, exchange, result]))
                except Exception as e:  # noqa: BLE001 (a size the device refuses: reported)
                    print(f"clusters of {cs} x {clusters}: {type(e).__name__}: {e}", flush=True)
                    break
                key = f"cluster {cs} x {clusters}{' + exchange' if exchange else ''}"
                out["cells"][key] = us
                print(f"{key:32s} {us:6.3f} us a step", flush=True)
    grid = torch.cuda._compile_kernel(GRID_SOURCE, "grid_steps")
    state = torch.zeros(2, dtype=torch.int32, device="cuda")
    for blocks in (16, sms):
        us = per_step_us(lambda n: grid(grid=(blocks, 1, 1), block=(128, 1, 1), args=[n, state, state[1:], result]))
        out["cells"][f"grid barrier, {blocks} blocks"] = us
        print(f"{'grid barrier, %d blocks' % blocks:32s} {us:6.3f} us a step", flush=True)
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}")
    for key, us in out["cells"].items():
        print(f"{key:32s} {us:6.3f} us")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
