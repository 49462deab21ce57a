#!/usr/bin/env bash
# Run 2026-11-30 ~14:37 UTC (written 2026-11-30 14:35 UTC): call 1 found the chain of 56 blocks 0.63-0.76x cuBLAS's
# time at 80-160 frames, but whole flow calls within their spread (a first call of one stream 22.1 ms per-block,
# 24.0 / 22.4 ms through the kernel; steady 27.8 → 24.8 / 23.0 ms). A second decoder's first call measures slower
# whichever its variant (bench/studies/codec_flow_profile.py's note), so here the variants run in both orders
# (prefetch, per-block, per-block, prefetch), alone and beside the llm's decode, with the tiles call 1 found best.
#   bash docs/results/prefetch_2026-11-30/call2.sh
#
# Predicted (written 2026-11-30 14:35 UTC, before the run): the chain at 80 / 160 frames 13-14.5 us a block against
# 20.8-21.3 (the new default tiles are call 1's best); whole calls alone, the mean of each variant's two runs: a first
# call of one stream 22-23 → 19-21 ms, steady 1 stream 27-28 → 23-25 ms, 4 streams' first call (320 frames) -1 to -3 ms, their
# steady call (640) within ±1 ms; beside the llm (34-37 ms at one stream) 3-6 ms less, the llm's
# step unchanged (11.2-12.9 ms).
source bench/wheel_site.sh
timeout 120 python3 bench/studies/prefetch_linear.py --frames 80,160,320,640 --json "$OUT/call2_study.json" 2>&1 \
  | grep -v Warning | tail -22
timeout 420 python3 bench/codec_history.py --streams 1,4 --modes history --variants prefetch,per-block,per-block,prefetch \
  --beside-llm --json "$OUT/call2_history.json" 2>&1 | grep -v Warning | tail -22
