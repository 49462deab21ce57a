#!/usr/bin/env bash
# Written 2026-11-30 ~18:10 UTC with call1.sh, before any run: whole flow calls of the folded estimator against
# `prefetch-apart`, in both orders (a second decoder's first call measures slower), alone and beside the llm's decode,
# with their kernel counts. Predicted: docs/benchmarks.md, fold-2026-11-30, and call1.sh's header.
#   bash docs/results/fold_2026-11-30/call2.sh
source bench/wheel_site.sh
timeout 420 python3 bench/codec_history.py --streams 1,4 --modes history \
  --variants prefetch,prefetch-apart,prefetch-apart,prefetch --kernels --beside-llm --json "$OUT/call1_history.json" \
  2>&1 | grep -v Warning | tail -24
