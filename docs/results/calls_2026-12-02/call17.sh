#!/usr/bin/env bash
# Written 2026-12-02 ~18:10 UTC, before any run (the session's device time was spent).
#   bash docs/results/calls_2026-12-02/call17.sh            (carry .whl)    overlap first, then the defaults
#   ORDER=reverse bash docs/results/calls_2026-12-02/call17.sh               the defaults first
#
# The playing calls pipelined (`--generator-overlap on`: each call's HiFT on a CUDA stream of its own beside the next
# call's flow; pipelined_worker.py) against the defaults, in the stack, under Poisson 30 for 20 s and 256 over 6 s on
# its own gateway (stacks.sh: every graph captured before serving, in both arms).
# Measured before (docs/benchmarks.md, generator-overlap-2026-12-02): bench/studies/generator_overlap.py at 32 streams in
# calls of 9 windows, 1.16x the windows a second beside the llm (132 against 114), 1.00x alone; a window's time in its
# call 82 against 76 ms beside the llm; the llm's step 14.8 against 14.4 ms.
# Predicted: the playing worker's audio a second +10-20% (its 17-32-window calls hold the generator's ~25% of its time);
# Poisson 30 admitted 445-490 (the defaults 413-426 on 2026-12-02), the ramp 148-170 (133-144), 100% or 99.5% stall-free;
# TTFA p95 within ±15 ms of the defaults'; the second chunk's time in the vocoder ±15 ms. Wrong if the overlap admits
# fewer than the defaults at Poisson 30 in both orders.
set -uo pipefail
if [[ ${ORDER:-} == reverse ]]; then
  bash docs/results/calls_2026-12-02/stacks.sh "defaults:" "overlap:--generator-overlap on"
else
  bash docs/results/calls_2026-12-02/stacks.sh "overlap:--generator-overlap on" "defaults:"
fi
