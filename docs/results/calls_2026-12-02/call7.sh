#!/usr/bin/env bash
# Written 2026-12-02 ~03:30 UTC, before this run: the same combination (`--urgent-seconds 0.4 --admit-growth 0.4
# --flow-history-streams 256`) under one stream, 256 started over 6 s three times, Poisson 30 for 20 s three times,
# then Poisson 30 for 60 s (a sustained overload, which the 20 s loads do not show).
#   bash docs/results/calls_2026-12-02/call7.sh
#   then: tar xzf call7_results.tgz && python3 docs/results/calls_2026-12-02/limit_at_refusals.py res
#
# Predicted: one stream TTFA p50 65-75 ms (69.0 at the defaults); the ramp 160-180 of 256 in each run, 100%
# stall-free, TTFA p95 270-300 ms; Poisson 30 (20 s) 400-440 of 600, 99.5-100%. Poisson 30 for 60 s: the first ~20 s
# as in the 20 s loads, then the later chunks' slack keeps falling (p50 ~1 s at 20 s) until the rule falls on it;
# over the 60 s 1,000-1,250 of ~1,800 admitted (55-70%), 98-100% stall-free: the vocoder's ~120x real time carries
# ~2/3 of Poisson 30's replies. Wrong, in the combination's favour, if over 70% are admitted at 100% stall-free.
set -uo pipefail
TAG=call7 RUNS=3 LOADS="one ramp p30 p30long" EXTRA="--urgent-seconds 0.4 --admit-growth 0.4 --flow-history-streams 256" \
  timeout 585 bash docs/results/defaults_2026-12-01/loads.sh
