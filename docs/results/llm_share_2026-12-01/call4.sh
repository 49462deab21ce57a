#!/usr/bin/env bash
# Written 2026-12-01 ~06:05 UTC with call3.sh, before either ran: the same stack with the llm's share fixed at 25% of
# the multiprocessors for every step (--no-mps-llm-follows-load: the stack before), the comparison for call3.
#   bash docs/results/llm_share_2026-12-01/call4.sh
#
# Predicted: one stream TTFA p50 86-90 ms (fold-stack-2026-11-30: 87.6), the llm's first chunk 60-64 ms; 256 over 6 s
# 139-168 admitted, >= 99% stall-free, TTFA p95 270-290 ms; no llm_gpu_place_steps_total line (no share).
set -uo pipefail
ARM=off N=4 timeout 560 bash docs/results/llm_share_2026-12-01/arm.sh
