"""The estimator's feed-forward on one thread-block cluster, against the per-block path's kernels, on one GPU: is a
stream's transformer block on a cluster (docs/benchmarks.md, cluster-2026-11-29) worth building?

The per-block path runs a transformer block's feed-forward as three dependent kernels: the first product with its
exact GELU (fused_linear.py), the second product (cuBLAS), the residual with the next block's LayerNorm
(frame_ops.py). At a first call's 80 rows each is bound by its latency, not its work. Here the same is one kernel
(CUDA C++ compiled at run time through NVRTC), a cluster of 16 blocks for each 80 rows:
- each block loads the rows (normed: [80, 256]) and its slices of the weights (W1's 64 rows, W2's 64 columns) into
  shared memory;
- ff1: its 64 hidden columns, [80, 64], with the bias and the exact GELU (mma.sync m16n8k16 in bf16, float
  accumulators);
- ff2, split over the hidden width: its part of every output column, [80, 256] in float;
- the cluster's barrier; each block sums its 16 output columns over the 16 blocks' parts through distributed shared
  memory, adds the bias and the residual, and the LayerNorm's row statistics go round the cluster the same way (two
  more barriers: the means, then the centred squares);
- out and the next norm1 of it, bf16.
Four cluster barriers (~0.2 us each, cluster_barrier.py) where the per-block path has two kernel boundaries and a
third kernel.

Checks the kernel's out and normed-next against the per-block path (SNR, dB; the issue asks >= 40 in bf16) and times
both in CUDA graphs (many repeats a graph, the median of several replays) at 80 rows (a stream's first call), 160,
2,560 and 5,120 (a steady call of 32 streams).

    python bench/studies/cluster_ff.py --json out.json
    python bench/studies/cluster_ff.py --compile-only [--nvrtc PATH/libnvrtc.so]   # no GPU: NVRTC's PTX for sm_90a
    python bench/studies/cluster_ff.py --emulate      # no GPU: its index arithmetic, lane by lane, against float32
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch

C, HID, CS, ROWS, THREADS = 256, 1024, 16, 80, 128  # channels, hidden width, blocks a cluster, rows a cluster, threads

SOURCE = r"""
#define C 256
#define HID 1024
#define CS 16
#define ROWS 80
#define HB (HID / CS)
#define OB (C / CS)
#define SA (C + 8)
#define SW1 (C + 8)
#define SW2 (HB + 8)
#define SH (HB + 8)
#define MT (ROWS / 16)

typedef unsigned short bf16;

__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bf16 f2bf(float f) {
  unsigned u = __float_as_uint(f);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
  return (bf16)(u >> 16);
}
__device__ __forceinline__ unsigned ld32(const bf16* p) { return *(const unsigned*)p; }
__device__ __forceinline__ void mma(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ unsigned cluster_id() {
  unsigned r; asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r)); return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float ld_peer(const float* mine, unsigned peer) {  // the same place in a peer's shared memory
  unsigned local, remote; float v;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(local) : "l"(mine));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(peer));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// acc[MT][2][4] = A @ B^T for ROWS rows and 16 columns: A [ROWS][K] (shared, row stride sa), B the 16 rows of the
// columns (shared, row stride sb); mma.sync m16n8k16, its fragments as PTX lays them out (gid = lane / 4, tig = lane % 4)
template <int K>
__device__ __forceinline__ void products(float (*acc)[2][4], const bf16* A, int sa, const bf16* B, int sb, int gid,
                                         int tig) {
  #pragma unroll
  for (int m = 0; m < MT; ++m)
    #pragma unroll
    for (int t = 0; t < 2; ++t)
      #pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][t][e] = 0.f;
  #pragma unroll 4
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned b[2][2];
    #pragma unroll
    for (int t = 0; t < 2; ++t) {
      const bf16* w = B + (t * 8 + gid) * sb + k0 + tig * 2;
      b[t][0] = ld32(w);
      b[t][1] = ld32(w + 8);
    }
    #pragma unroll
    for (int m = 0; m < MT; ++m) {
      const bf16* a = A + (m * 16 + gid) * sa + k0 + tig * 2;
      unsigned a0 = ld32(a), a1 = ld32(a + 8 * sa), a2 = ld32(a + 8), a3 = ld32(a + 8 * sa + 8);
      mma(acc[m][0], a0, a1, a2, a3, b[0][0], b[0][1]);
      mma(acc[m][1], a0, a1, a2, a3, b[1][0], b[1][1]);
    }
  }
}

extern "C" __global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(128)
cluster_ff(const bf16* __restrict__ normed, const bf16* __restrict__ x, const bf16* __restrict__ w1,
           const bf16* __restrict__ b1, const bf16* __restrict__ w2, const bf16* __restrict__ b2,
           const bf16* __restrict__ g, const bf16* __restrict__ be, bf16* __restrict__ out,
           bf16* __restrict__ out_normed, int R, float eps) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sA = (bf16*)smem;               // [ROWS][SA]   the cluster's rows of normed
  bf16* sW1 = sA + ROWS * SA;           // [HB][SW1]    W1's rows of this block's hidden columns
  bf16* sW2 = sW1 + HB * SW1;           // [C][SW2]     W2's columns of them
  bf16* sH = sW2 + C * SW2;             // [ROWS][SH]   GELU(ff1) of them
  float* sP = (float*)(sH + ROWS * SH); // [ROWS][C]    this block's part of ff2 (read by the cluster)
  float* sOut = sP + ROWS * C;          // [ROWS][OB]   out, this block's columns
  float* sSum = sOut + ROWS * OB;       // [ROWS]       their sums (read by the cluster)
  float* sSq = sSum + ROWS;             // [ROWS]       their centred squares (read by the cluster)
  float* sMean = sSq + ROWS;
  float* sRstd = sMean + ROWS;

  const unsigned rank = cluster_rank();
  const int r0 = (int)cluster_id() * ROWS;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;

  for (int i = tid; i < ROWS * (C / 8); i += 128) {  // 16-byte pieces
    int r = i / (C / 8), c8 = (i % (C / 8)) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < R) v = *(const uint4*)(normed + (size_t)(r0 + r) * C + c8);
    *(uint4*)(sA + r * SA + c8) = v;
  }
  for (int i = tid; i < HB * (C / 8); i += 128) {
    int n = i / (C / 8), c8 = (i % (C / 8)) * 8;
    *(uint4*)(sW1 + n * SW1 + c8) = *(const uint4*)(w1 + (size_t)(rank * HB + n) * C + c8);
  }
  for (int i = tid; i < C * (HB / 8); i += 128) {
    int n = i / (HB / 8), k8 = (i % (HB / 8)) * 8;
    *(uint4*)(sW2 + n * SW2 + k8) = *(const uint4*)(w2 + (size_t)n * HID + rank * HB + k8);
  }
  __syncthreads();

  {  // ff1: warp w's 16 hidden columns, every row; + b1, exact GELU → sH (bf16)
    float acc[MT][2][4];
    products<C>(acc, sA, SA, sW1 + warp * 16 * SW1, SW1, gid, tig);
    #pragma unroll
    for (int m = 0; m < MT; ++m)
      #pragma unroll
      for (int t = 0; t < 2; ++t)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          int row = m * 16 + gid + (e >= 2 ? 8 : 0), col = warp * 16 + t * 8 + tig * 2 + (e & 1);
          float v = acc[m][t][e] + bf2f(b1[rank * HB + col]);
          sH[row * SH + col] = f2bf(0.5f * v * (1.f + erff(v * 0.70710678118654752f)));
        }
  }
  __syncthreads();

  #pragma unroll 1
  for (int chunk = 0; chunk < 4; ++chunk) {  // ff2's part over this block's hidden columns: warp w's 64 outputs
    const int n0 = warp * 64 + chunk * 16;
    float acc[MT][2][4];
    products<HB>(acc, sH, SH, sW2 + n0 * SW2, SW2, gid, tig);
    #pragma unroll
    for (int m = 0; m < MT; ++m)
      #pragma unroll
      for (int t = 0; t < 2; ++t)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          int row = m * 16 + gid + (e >= 2 ? 8 : 0), col = n0 + t * 8 + tig * 2 + (e & 1);
          sP[row * C + col] = acc[m][t][e];
        }
  }
  cluster_sync();  // every block's part of ff2 is in

  for (int i = tid; i < ROWS * OB; i += 128) {  // this block's columns: the parts summed, + b2 (a bf16 product, as
    int r = i / OB, c = i % OB, col = rank * OB + c;  // F.linear's), + the residual, rounded to bf16 as out is
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < CS; ++j) s += ld_peer(sP + r * C + col, (unsigned)j);
    float xv = (r0 + r < R) ? bf2f(x[(size_t)(r0 + r) * C + col]) : 0.f;
    sOut[r * OB + c] = bf2f(f2bf(bf2f(f2bf(s + bf2f(b2[col]))) + xv));
  }
  __syncthreads();
  if (tid < ROWS) {
    float s = 0.f;
    #pragma unroll
    for (int c = 0; c < OB; ++c) s += sOut[tid * OB + c];
    sSum[tid] = s;
  }
  cluster_sync();
  if (tid < ROWS) {
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < CS; ++j) s += ld_peer(sSum + tid, (unsigned)j);
    float mean = s / C, q = 0.f;
    #pragma unroll
    for (int c = 0; c < OB; ++c) { float d = sOut[tid * OB + c] - mean; q += d * d; }
    sMean[tid] = mean;
    sSq[tid] = q;
  }
  cluster_sync();
  if (tid < ROWS) {
    float q = 0.f;
    #pragma unroll
    for (int j = 0; j < CS; ++j) q += ld_peer(sSq + tid, (unsigned)j);
    sRstd[tid] = rsqrtf(q / C + eps);
  }
  __syncthreads();
  for (int i = tid; i < ROWS * OB; i += 128) {
    int r = i / OB, c = i % OB, col = rank * OB + c;
    if (r0 + r >= R) continue;
    float v = sOut[r * OB + c];
    out[(size_t)(r0 + r) * C + col] = f2bf(v);
    out_normed[(size_t)(r0 + r) * C + col] = f2bf((v - sMean[r]) * sRstd[r] * bf2f(g[col]) + bf2f(be[col]));
  }
  cluster_sync();  // no block leaves while the others may still read its shared memory
}
"""


def smem_bytes() -> int:
    """The kernel's dynamic shared memory, as its source lays it out."""
    hb = HID // CS
    bf16 = ROWS * (C + 8) + hb * (C + 8) + C * (hb + 8) + ROWS * (hb + 8)
    return 2 * bf16 + 4 * (ROWS * C + ROWS * (C // CS) + 4 * ROWS)


def nvrtc_ptx(lib: str, arch: str = "sm_90a") -> str:
    """SOURCE → PTX through the NVRTC library at `lib` (no GPU needed); raises with NVRTC's log on an error."""
    nvrtc = ctypes.CDLL(lib)
    prog = ctypes.c_void_p()
    src = SOURCE.encode()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"cluster_ff.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--use_fast_math"]
    status = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if status != 0:
        raise RuntimeError(f"NVRTC: {log.value.decode(errors='replace')}")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


class ClusterFF:
    """The kernel, compiled and launched: (normed, x) [R, C] bf16 → (out, normed next) [R, C] bf16."""

    def __init__(self, w1, b1, w2, b2, g, be, eps: float):
        from cluster_barrier import allow_large_clusters

        self.kernel = torch.cuda._compile_kernel(SOURCE, "cluster_ff")
        if not allow_large_clusters(self.kernel):
            raise RuntimeError("clusters of 16 blocks are not allowed here")
        self.kernel.set_shared_memory_config(smem_bytes())
        self.weights, self.eps = [t.contiguous() for t in (w1, b1, w2, b2, g, be)], eps

    def __call__(self, normed: torch.Tensor, x: torch.Tensor, out: torch.Tensor, out_normed: torch.Tensor) -> None:
        R = normed.shape[0]
        w1, b1, w2, b2, g, be = self.weights
        self.kernel(grid=(math.ceil(R / ROWS) * CS, 1, 1), block=(THREADS, 1, 1), shared_mem=smem_bytes(),
                    args=[normed, x, w1, b1, w2, b2, g, be, out, out_normed, R, self.eps])


def per_block_path(dim: int, device):
    """The estimator's own feed-forward and the frame_norm that follows it (residual, the next block's norm1)."""
    from torch import nn

    from services.vocoder.codec.estimator import FeedForward
    from services.vocoder.codec.frame_ops import frame_norm

    ff, norm = FeedForward(dim).to(device, torch.bfloat16), nn.LayerNorm(dim).to(device, torch.bfloat16)
    with torch.no_grad():
        for p in list(ff.parameters()) + list(norm.parameters()):
            p.normal_(0, 1 / math.sqrt(p.shape[-1]) if p.dim() > 1 else 0.1)

    def run(normed, x):
        return frame_norm(ff(normed[None]), residual=x[None], then=norm)

    gelu, _, second = ff.net
    return run, (gelu.proj.weight, gelu.proj.bias, second.weight, second.bias, norm.weight, norm.bias), norm.eps


def snr_db(got: torch.Tensor, want: torch.Tensor) -> float:
    noise = (got.float() - want.float()).pow(2).sum()
    return float(10 * torch.log10(want.float().pow(2).sum() / noise.clamp_min(1e-30)))


def graph_us(fn, device, repeats: int = 100, replays: int = 30) -> float:
    """Microseconds a call of fn: a CUDA graph of `repeats` calls, the median of `replays` replays (measure.py)."""
    from measure import graph_time

    return graph_time(fn, repeats, replays, device) * 1e6 / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="80,160,2560,5120")
    p.add_argument("--compile-only", action="store_true", help="NVRTC's PTX for sm_90a only (no GPU)")
    p.add_argument("--nvrtc", default="", help="with --compile-only: the NVRTC library (default: the nvidia wheel's)")
    p.add_argument("--emulate", action="store_true", help="the kernel's index arithmetic emulated on the CPU, lane by "
                   "lane, against a float reference (no GPU; a minute)")
    p.add_argument("--json")
    args = p.parse_args()
    print(f"shared memory a block: {smem_bytes()} bytes")
    if args.emulate:
        from cluster_ff_emulate import check_emulated

        check_emulated()
        return
    if args.compile_only:
        lib = args.nvrtc or str(next(Path(__import__("nvidia").__path__[0]).rglob("libnvrtc.so*")))
        ptx = nvrtc_ptx(lib)
        print(f"PTX {len(ptx)} characters; mma.sync {ptx.count('mma.sync')}, barrier.cluster "
              f"{ptx.count('barrier.cluster.arrive')}, ld.shared::cluster {ptx.count('ld.shared::cluster')}")
        return
    from measure import gpu_record

    torch.manual_seed(0)
    device = torch.device("cuda")
    out = gpu_record()
    with torch.inference_mode():
        reference, weights, eps = per_block_path(C, device)
        cluster = ClusterFF(*weights, eps)
        print(f"{'rows':>6s} {'per-block us':>12s} {'cluster us':>10s} {'ratio':>6s} {'out SNR dB':>10s} {'normed SNR dB':>13s}")
        for R in [int(r) for r in args.rows.split(",")]:
            normed = torch.randn(R, C, device=device, dtype=torch.bfloat16)
            x = torch.randn(R, C, device=device, dtype=torch.bfloat16)
            got, got_normed = torch.empty_like(x), torch.empty_like(x)
            want, want_normed = reference(normed, x)
            cluster(normed, x, got, got_normed)
            torch.cuda.synchronize()
            cell = {"out_snr_db": snr_db(got, want[0]), "normed_snr_db": snr_db(got_normed, want_normed[0]),
                    "per_block_us": graph_us(lambda: reference(normed, x), device),
                    "cluster_us": graph_us(lambda: cluster(normed, x, got, got_normed), device)}
            cell["ratio"] = cell["cluster_us"] / cell["per_block_us"]
            out["cells"][str(R)] = cell
            print(f"{R:6d} {cell['per_block_us']:12.2f} {cell['cluster_us']:10.2f} {cell['ratio']:6.2f} "
                  f"{cell['out_snr_db']:10.1f} {cell['normed_snr_db']:13.1f}", flush=True)
    print(f"\n{out['gpu']}, torch {out['torch']}, {out['date']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
