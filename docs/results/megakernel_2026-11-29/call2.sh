#!/usr/bin/env bash
# Where the persistent run's time goes: the barrier alone, each stage alone, and the variants (tiles, programs a
# multiprocessor, the products' loops pipelined as one), at a first call's and a steady call's rows.
#   bash docs/results/megakernel_2026-11-29/call2.sh
#
# Predicted (written 2026-11-29 09:35 UTC, before the call). Call 1 measured the run slower than the per-block path:
# +0.9 ms an Euler step at a first call (~6 us a stage where ~3 were predicted), 2.1x at 32 streams. So: a barrier
# of 132 programs costs 1.5-3 us (one counter, 132 arrivals serialised at L2, then every program polling one line);
# at 80 rows the slowest stage alone is ff2 (8 tiles, each 16 serial K steps: ~4-5 us), q|k|v ~2 us; at 5,120 rows
# the products alone run ~2-3x cuBLAS's time (1 program of 4 warps a multiprocessor, no loads in flight across tiles),
# and flattening the loops gains 1.3-1.8x there, 2 programs a multiprocessor 1.2-1.5x.
set -uo pipefail
OUT=${OUT:-/tmp/out}
source bench/wheel_site.sh > /dev/null
timeout 420 python3 bench/studies/megakernel_stages.py --json "$OUT/megakernel_stages.json" 2>&1 | tee "$OUT/megakernel_stages.log" | tail -45
