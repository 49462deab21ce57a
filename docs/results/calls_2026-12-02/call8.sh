#!/usr/bin/env bash
# Written 2026-12-02 ~03:30 UTC, before this run: the defaults under Poisson 30 for 60 s, then 256 started over 6 s,
# to set beside call7's sustained load.
#   bash docs/results/calls_2026-12-02/call8.sh
#
# Predicted: Poisson 30 for 60 s 1,050-1,200 of ~1,800 admitted (~198x of ~327x asked: 60%, a little over with the
# drain; the limit sits at ~40-48 turns, on the second chunks' slack, from the first seconds), 100% stall-free, turns
# p50 ~2.1 s; the ramp 130-145. Beside call7: the defaults admit 10-25% more over the 60 s. (Revised ~04:40 UTC, before
# the run: the first version said 1,150-1,300 and "within ±10%", from the vocoder's average over the whole run, which
# counts the drain.)
set -uo pipefail
TAG=call8 RUNS=1 LOADS="p30long ramp" timeout 400 bash docs/results/defaults_2026-12-01/loads.sh
# Run 2026-12-02 13:28 UTC with LOADS="p30long" only (the device time left held one load): the defaults admitted
# 1,258 of 1,800, 99.5% stall-free (docs/benchmarks.md, sustained-2026-12-02).
