#!/usr/bin/env bash
# Written 2026-12-02 ~13:50 UTC, before any run; revised ~14:00 UTC (still before any run) with the lazily kept max.
# The attention with its running max kept lazily (chunk_attention.LAZY_RESCALE, off by default), by tile and in the
# flow's steady calls; then the counters of the flow's three costliest Triton kernels at a steady call of 32 streams,
# and cuBLAS's product of the same shape, read by Nsight Compute (the lent H200 is a Firecracker machine, where ncu
# read counters on 2026-11-04: ../.library/device/KINDS.md); then the attention's GPU tests.
#   bash docs/results/calls_2026-12-02/call10.sh      (carry .whl)
#
# Why: no tile, loop order or program shape moved them (docs/benchmarks.md, sustained-2026-12-02). The attention at 32
# streams takes 26.9 us against ~4 us of its bytes; compiled for sm_90 its 16 x 16 step of one warp is 271 / 271 /
# 284 instructions (the prefix's, the ring's and the row's own walk; tests/kernel_compile_check.py --loop-steps),
# which 19-20 warps a multiprocessor issue in ~15 us at one a cycle per scheduler: it is bound by what it issues,
# which also explains why the one loop (more instructions a step) was 1.5x slower. Kept lazily: 209 / 208 / 226.
# frame_norm takes 5.8 us against ~3; the feed-forward's product and GELU 16.3 us against ~3.4 of its FLOPs.
# Predicted:
#   codec_kernels.py: "history 32" 16x16 w1 lazy 20-23 us against 25.7 (-10-22%); "history 16" 64x32 w4 lazy within
#     -15%..+5% of 17.1 (its branch needs a reduction across 4 warps); 16x32 w1 lazy and 16x64 w1 lazy slower than
#     16x16 w1 lazy at history 32 (the padded keys of the ring's 40 and a chunk's 20); every lazy cell's error against
#     PyTorch's form within 2x the default's.
#   codec_flow_profile.py --variants defaults,attention-lazy: the steady call at 32 streams 1.5-3 ms faster in graphs
#     (560 attentions of 3-5 us less), 16 streams 0-1.5 ms; the mel's SNR against the defaults 45-70 dB (p rounds to
#     bf16 against another max).
#   ncu, the attention: issue slots busy over 50% and the top stall not "long scoreboard" (if long scoreboard leads,
#     the loads are the limit after all, and the instruction count is the wrong lever); with the lazy max, fewer
#     instructions executed by ~20%. frame_norm: one partial wave (~2.4 programs a multiprocessor), DRAM under 50%
#     of peak. linear_gelu: the tensor pipes under 30% busy; cuBLAS's product alone 8-12 us.
# Revised 2026-12-02 ~15:15 UTC, before any run: the wheels and PYTHONPATH of bench/wheel_site.sh, for the tests.
source bench/wheel_site.sh
timeout 200 python3 bench/studies/codec_kernels.py --json "$OUT/attention_tiles.json" 2>&1 | tail -12
timeout 200 python3 bench/studies/codec_flow_profile.py --streams 16,32 --variants defaults,attention-lazy \
  --json "$OUT/flow_profile_lazy.json" > "$OUT/flow_profile_lazy.log" 2>&1
grep -E "SNR vs the first variant|^eager:|_chunk_attention" "$OUT/flow_profile_lazy.log"
ncu --version | tail -1
for k in attention:_chunk_attention attention_lazy:_chunk_attention frame_norm:_frame_norm linear_gelu:_linear_gelu \
         "cublas:nvjet|gemm|xmma"; do
  name=${k%%:*}
  timeout 100 ncu --clock-control none -k regex:"${k#*:}" --launch-skip 12 --launch-count 2 --set full \
    python3 bench/studies/codec_kernel_counters.py --only "$name" > "$OUT/ncu_$name.txt" 2>&1
  echo "== $name (rc $?)"
  grep -E "^\s+(Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Waves Per SM|Issue Slots Busy|Executed Ipc Active|Executed Instructions )" \
    "$OUT/ncu_$name.txt" | head -18
done
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_chunk_attention.py tests/test_kernel_compile.py 2>&1 | tail -4
