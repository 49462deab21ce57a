#!/usr/bin/env bash
# Written 2026-12-02 ~15:50 UTC, before any run (not run on 2026-12-02: the session's device time was spent).
#   bash docs/results/calls_2026-12-02/call13.sh      (carry .whl)
#
# The loads on the stack at the defaults, now with the attention's small tile kept lazily at 96 registers from
# 6 streams (docs/benchmarks.md, small-tile-2026-12-02: steady calls alone 2.6 / 2.5 / 1.1 ms faster at 6 / 16 / 32
# streams, 2-8% of a call).
# Predicted: one stream TTFA p50 66-72 ms (a first call's tile is not the small one: as before, 69.0); 256 over 6 s
# 136-150 admitted (the defaults' 132-141 in three runs on 2026-12-01: the vocoder's ~2-5% more windows a second is
# within that spread), 100% stall-free, p95 ≤ 250 ms; Poisson 30 for 20 s 397-425 of 600 (397-402), ≥ 99.5%
# stall-free. The vocoder's calls beside the llm at 32 windows ~125 ms against 129 (limit_at_refusals.py).
set -uo pipefail
TAG=call13 RUNS=3 LOADS="one ramp p30" timeout 580 bash docs/results/defaults_2026-12-01/loads.sh
