#!/usr/bin/env bash
# Written 2026-12-02 ~03:25 UTC, after call4 and before this run: where a steady flow call's time goes, by kernel
# (bench/studies/codec_flow_profile.py at 16 and 32 streams, alone), then one stack with urgent calls, the limit grown
# by TTFA's room, and the flow's stream history at 256 slots (the admission limit's cap is the vocoders' slots, 128).
#   bash docs/results/calls_2026-12-02/call5.sh
#
# Why (calls 1 and 4): with --urgent-seconds 0.4 (or 0.6) and --admit-growth 0.4 the limit reached its cap of 128
# turns in ~8 s of Poisson 30 and stayed there, 100% stall-free, the later chunks still 0.67-0.74 s ahead at p2; but
# each turn then lasted 5.4-6.3 s (sent to last chunk, p50; 2.1 s at the defaults), so 128 turns admitted 24/s and
# Poisson 30 got 346-377 of 600 against the defaults' 399. The vocoder made the same audio as before (105-121x real
# time against 116-130x, 82-89% busy): the later chunks waited for the urgent ones. Calls of w windows cost ~21 ms
# + ~4.5 ms a window beside the llm (a fit to the defaults' 16.4-window calls of 94.6 ms and urgent04's 9.2-window
# calls of 62 ms), so larger calls would buy little: the flow's work per window, not its per-call fixed cost, bounds
# the stack.
# Predicted:
#   the profile: a steady call at 32 streams 58-68 ms alone (6-7x its floor), ~390 kernels an Euler step; cuBLAS's
#     products 35-45% of the device time, attention 15-25%, the per-frame work (norms, GELU, residuals, convolutions,
#     copies) 30-45%.
#   u04g256 (Poisson 30 for 20 s, then 256 started over 6 s): the limit climbs past 128 to 150-200, turns last longer
#     still (p50 6-8 s), admitted Poisson 30 380-450 of 600 (the vocoder's ~120x real time bounds it), 99-100%
#     stall-free; the ramp 135-160. Wrong if Poisson 30 admits over 480: then the slots, not the vocoder's
#     throughput, held call4's stacks.
set -uo pipefail
mkdir -p "${OUT:-/tmp/out}"
timeout 170 python3 bench/studies/codec_flow_profile.py --streams 16,32 --variants defaults \
  --json "${OUT:-/tmp/out}/flow_profile.json" 2>&1 | tail -45
bash docs/results/calls_2026-12-02/stacks.sh \
  "u04g256:--urgent-seconds 0.4 --admit-growth 0.4 --flow-history-streams 256"
