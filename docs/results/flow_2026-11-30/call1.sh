#!/usr/bin/env bash
# Three studies not run on a GPU before, in order:
#   1. bench/studies/cluster_ff.py: the estimator's feed-forward as one kernel on a 16-block cluster against the
#      per-block path's three kernels (decides whether the cluster estimator is built);
#   2. bench/studies/mps_kill.py: which kind of victim work, SIGKILLed under MPS, faults an idle neighbour;
#   3. bench/codec_history.py --beside-llm: steady and first calls alone and beside the llm's decode steps.
#   bash docs/results/flow_2026-11-30/call1.sh
#
# Predicted (written 2026-11-30 01:20 UTC, before the call):
# 1. out and normed-next SNR >= 50 dB (53.2/51.3 in the CPU emulation); 80 rows: per-block 8-12 us, cluster 3.5-5 us;
#    5,120 rows: per-block ~40 us, cluster 20-30 us. A risk: 16 blocks of 208 KB each may not be co-scheduled on one
#    GPC (the launch then fails; the study says so).
# 2. idle, matmul, copies: 0 faults; graph, graph-pdl or capture: a fault in at least 1 of 4 kills (the vocoder's
#    5 of 15 came from work of that shape).
# 3. alone as in cover-2026-11-29 (32 streams steady ~60 ms, first call ~22 ms); beside the llm 1.5-2.5x slower,
#    and the llm's step 6.4 -> 9-12 ms.
source bench/wheel_site.sh
timeout 150 python3 bench/studies/cluster_ff.py --json "$OUT/cluster_ff.json" 2>&1 | tail -12
timeout 270 python3 bench/studies/mps_kill.py --trials 4 --json "$OUT/mps_kill.json" 2>&1 | tail -12
timeout $((580 - SECONDS)) python3 bench/codec_history.py --streams 1,16,32 --modes history --beside-llm \
  --json "$OUT/codec_history.json" 2>&1 | tail -12
