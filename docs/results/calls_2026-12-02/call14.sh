#!/usr/bin/env bash
# Written 2026-12-02 ~16:40 UTC, before any run (not run on 2026-12-02: the session's device time was spent);
# revised ~16:50 UTC, before any run: the norm variant added.
#   bash docs/results/calls_2026-12-02/call14.sh      (carry .whl)
#
# Why: at 32 streams Nsight Compute timed the feed-forward's Triton product with its GELU at 17.5 us, and cuBLAS's
# product of the same shape at 9.3 us (docs/benchmarks.md, small-tile-2026-12-02). PyTorch's GELU after cuBLAS reads
# and writes the 5,120 x 1,024 bf16 product once more (~21 MB, ~5-7 us from HBM, less from L2). Apart was slower at
# 1-12 streams on an H100 (fused_linear.py); at 32 streams on an H200 it was not measured.
# Predicted: codec_fused_linear.py at 32 streams (5,120 frames): cuBLAS + GELU 13-16 us against the fused kernel's
# 15.5-17.5; at 1-6 streams the fused kernel faster, as on the H100. The flow, defaults / gelu-unfused / gelu-unfused /
# defaults: 32 streams' steady call within ±1.5 ms either way (560 products of ±2 us); 6 streams' 0.5-1.5 ms slower
# apart; the mel's SNR between them 45-60 dB (PyTorch rounds the product before its GELU).
# And frame_norm with a warp for each 4 frames (`norm-rows-4-warps-1`; the default: 16 frames on 4 warps): compiled for
# sm_90 (launch-aligned) it keeps its 616 instructions against 632 but drops its 3 barriers and its shared memory (the
# row sums stay in one warp's shuffles). Predicted: a norm 5.0-5.6 us against 5.9 at 32 streams (1,280 one-warp
# programs, all resident); a steady call 0.3-1.2 ms faster in eager kernel time at 16 and 32 streams; the mel within
# float32 rounding of the defaults' (SNR over 100 dB: the same sums in another order).
source bench/wheel_site.sh
timeout 150 python3 bench/studies/codec_fused_linear.py --json "$OUT/fused_linear.json" 2>&1 | tail -8
timeout 420 python3 bench/studies/codec_flow_profile.py --streams 6,16,32 \
  --variants defaults,gelu-unfused,norm-rows-4-warps-1,norm-rows-4-warps-1,gelu-unfused,defaults \
  --json "$OUT/flow_profile_gelu.json" > "$OUT/flow_profile_gelu.log" 2>&1
grep -E "^eager:|_linear_gelu|gelu_|_frame_norm" "$OUT/flow_profile_gelu.log" | head -60
tail -26 "$OUT/flow_profile_gelu.log"
