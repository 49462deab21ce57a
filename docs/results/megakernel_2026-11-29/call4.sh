#!/usr/bin/env bash
# The llm's steps against the roofline beside the cuBLAS floor (bench/llm_engine.py's new columns), and the peer.
#   bash docs/results/megakernel_2026-11-29/call4.sh
#
# Predicted (written 2026-11-29 09:55 UTC, before the call; an H200, copy 4.25 TB/s, bf16 rate ~750 TFLOP/s): decode at
# context 512 is bound by its bytes at every batch measured: batch 1 reads 14.03 GB of weights and 75 MB of K/V,
# 3.32 ms, so today's 4.92 ms is ~1.48x its roofline (1.09x the cuBLAS floor); batch 64, 18.9 GB with its K/V,
# ~4.4 ms, ~1.1x; batch 128 ~1.2x. Prefill 512 is bound by its FLOPs (7.2 TFLOP, ~9.6 ms): ~1.2-1.3x.
set -uo pipefail
OUT=${OUT:-/tmp/out}
OUT="$OUT" timeout 420 bash bench/gpu_smoke.sh bench 2>&1 | tail -26
