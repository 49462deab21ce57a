#!/usr/bin/env bash
# A thread-block cluster's barrier and distributed-shared-memory exchange against a grid barrier in global memory:
# what a step would cost a kernel that owns a stream's rows on a cluster (bench/studies/cluster_barrier.py).
#   bash docs/results/megakernel_2026-11-29/call5.sh
#
# Predicted (written 2026-11-29 09:42 UTC, before the call; an H200): a cluster barrier is the hardware's, 0.2-0.4 us
# a step at 2-16 blocks, one cluster or as many as fit; a word exchanged through distributed shared memory with two
# barriers 0.4-0.8 us; the global-memory grid barrier 1.5-2 us at 132 blocks (Triton's measured 1.76), 0.8-1.2 at 16.
set -uo pipefail
OUT=${OUT:-/tmp/out}
source bench/wheel_site.sh > /dev/null
timeout 200 python3 bench/studies/cluster_barrier.py --json "$OUT/cluster_barrier.json" 2>&1 | tee "$OUT/cluster_barrier.log" | tail -22
