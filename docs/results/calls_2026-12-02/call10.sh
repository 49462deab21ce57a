#!/usr/bin/env bash
# Written 2026-12-02 ~14:15 UTC, before any run: the counters of the flow's three costliest Triton kernels at a steady
# call of 32 streams, and cuBLAS's product of the same shape, read by Nsight Compute (the lent H200 is a Firecracker
# machine, where ncu read counters on 2026-11-04: ../.library/device/KINDS.md).
#   bash docs/results/calls_2026-12-02/call10.sh
#
# Why: no tile, loop order or program shape moved them (docs/benchmarks.md, sustained-2026-12-02). At 32 streams the
# attention takes 26.9 us against ~4 us of its bytes, frame_norm 5.8 against ~3, the feed-forward's product and GELU
# 16.3 us against ~3.4 of its FLOPs (and ~3 of its bytes). The counters say which of latency, issue, memory or the
# tensor pipes holds each.
# Predicted:
#   attention (2,560 programs of one warp, ~16 blocks of 16 keys each): achieved occupancy under 40% of the warps a
#     multiprocessor holds; the top warp stall "long scoreboard" (waiting on global loads) over "math pipe throttle";
#     DRAM throughput under 25% of peak; the tensor pipes under 10% busy.
#   frame_norm (320 programs of 16 frames): one partial wave (~2.4 programs a multiprocessor), DRAM and L2 under 50%,
#     most of its time before its first loads return and in its tail: duration ~2x the bytes' time.
#   linear_gelu (640 programs of 64 x 128, 4 steps of K): the tensor pipes under 30% busy, the exact GELU's erf on
#     8,192 float32 outputs a program a visible share of the FMA/ALU pipes; cuBLAS's product alone 8-12 us.
# Wrong if the attention's top stall is the math pipes or its occupancy is over 60%: then its chain, not its loads,
# is the limit, and a kernel that keeps more programs per multiprocessor will not help.
set -uo pipefail
mkdir -p "${OUT:-/tmp/out}"
ncu --version | tail -1
for k in attention:_chunk_attention frame_norm:_frame_norm linear_gelu:_linear_gelu "cublas:nvjet|gemm|xmma"; do
  name=${k%%:*}
  timeout 150 ncu --clock-control none -k regex:"${k#*:}" --launch-skip 12 --launch-count 2 --set full \
    python3 bench/studies/codec_kernel_counters.py --only "$name" > "$OUT/ncu_$name.txt" 2>&1
  echo "== $name (rc $?)"
  grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Size|Grid Size|Waves Per SM|Issue Slots Busy|Executed Ipc Active)" \
    "$OUT/ncu_$name.txt" | head -26
  grep -iE "stall|warp cycles per issued" "$OUT/ncu_$name.txt" | head -8
done
