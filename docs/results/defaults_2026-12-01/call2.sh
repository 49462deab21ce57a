#!/usr/bin/env bash
# Written 2026-12-01 ~11:25 UTC, before this run: the protocol (three runs of each load on one gateway, the
# median) at the defaults, which since 2026-12-01 have the llm's share follow the load. Only single runs of it were
# measured (llm_share_2026-12-01). This call: one stream, then 256 over 6 s and Poisson 30 three times each.
#   bash docs/results/defaults_2026-12-01/call2.sh
#
# Predicted: TTFA p50 at one stream 68-78 ms (74.0 / 68.5); the ramp 135-150 of 256 admitted (142), 99-100%
# stall-free, TTFA p95 270-285 ms; Poisson 30 400-440 of ~600 (432), 100% stall-free, p95 265-285 ms. No target
# but one stream's met: the flow's calls are what they were.
set -uo pipefail
TAG=call2 RUNS=3 LOADS="one ramp p30" timeout 585 bash docs/results/defaults_2026-12-01/loads.sh
