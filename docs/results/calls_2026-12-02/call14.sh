#!/usr/bin/env bash
# Written 2026-12-02 ~16:40 UTC, before any run (not run on 2026-12-02: the session's device time was spent).
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
source bench/wheel_site.sh
timeout 150 python3 bench/studies/codec_fused_linear.py --json "$OUT/fused_linear.json" 2>&1 | tail -8
timeout 300 python3 bench/studies/codec_flow_profile.py --streams 6,16,32 \
  --variants defaults,gelu-unfused,gelu-unfused,defaults \
  --json "$OUT/flow_profile_gelu.json" > "$OUT/flow_profile_gelu.log" 2>&1
grep -E "^eager:|_linear_gelu|gelu_|nvjet" "$OUT/flow_profile_gelu.log" | head -40
tail -18 "$OUT/flow_profile_gelu.log"
