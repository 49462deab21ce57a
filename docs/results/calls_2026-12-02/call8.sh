#!/usr/bin/env bash
# Written 2026-12-02 ~03:30 UTC, before this run: the defaults under Poisson 30 for 60 s, then 256 started over 6 s,
# to set beside call7's sustained load.
#   bash docs/results/calls_2026-12-02/call8.sh
#
# Predicted: Poisson 30 for 60 s 1,150-1,300 of ~1,800 admitted (the 20 s loads' 66% held: the limit sits at ~40-48
# turns, on the second chunks' slack, from the first seconds), 100% stall-free, turns p50 ~2.1 s; the ramp 130-145.
# Beside call7: the combination within ±10% of the defaults over 60 s (both bound by the vocoder's ~120x real time).
set -uo pipefail
TAG=call8 RUNS=1 LOADS="p30long ramp" timeout 400 bash docs/results/defaults_2026-12-01/loads.sh
