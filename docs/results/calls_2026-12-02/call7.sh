#!/usr/bin/env bash
# Written 2026-12-02 ~03:30 UTC, before this run: the same combination (`--urgent-seconds 0.4 --admit-growth 0.4
# --flow-history-streams 256`) under one stream, 256 started over 6 s three times, Poisson 30 for 20 s three times,
# then Poisson 30 for 60 s (a sustained overload, which the 20 s loads do not show).
#   bash docs/results/calls_2026-12-02/call7.sh
#   then: tar xzf call7_results.tgz && python3 docs/results/calls_2026-12-02/limit_at_refusals.py res
#
# Predicted: one stream TTFA p50 65-75 ms (69.0 at the defaults); the ramp 160-180 of 256 in each run, 100%
# stall-free, TTFA p95 270-300 ms; Poisson 30 (20 s) 400-440 of 600, 99.5-100%. Poisson 30 for 60 s: the first ~20 s
# as in the 20 s loads, then the later chunks' slack keeps falling (p50 ~1 s at 20 s) until the rule falls on it.
# Revised ~04:40 UTC, still before the run, from the audio the clients received while the load was offered
# (limit_at_refusals.py's second line): with urgent calls the vocoder made 158-164x real time against the defaults'
# 198x, and Poisson 30 asks ~327x (10.9 s of audio a turn). Once the buffers are spent the combination admits what
# ~160x carries: over the 60 s 850-1,000 of ~1,800 (47-55%; the first version said 1,000-1,250), 97-100% stall-free,
# fewer than call8's defaults. Wrong, in the combination's favour, if it admits as many as the defaults at 100%.
set -uo pipefail
TAG=call7 RUNS=3 LOADS="one ramp p30 p30long" EXTRA="--urgent-seconds 0.4 --admit-growth 0.4 --flow-history-streams 256" \
  timeout 585 bash docs/results/defaults_2026-12-01/loads.sh
