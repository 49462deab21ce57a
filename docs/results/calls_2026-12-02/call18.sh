#!/usr/bin/env bash
# Written 2026-12-02 ~18:15 UTC, before any run (the session's device time was spent).
#   bash docs/results/calls_2026-12-02/call18.sh      (carry .whl)
#
# bench/studies/generator_overlap.py at the flow's own call limits (its first runs took the stand-in's 1,024 frames:
# calls of 9 windows, 1.16x beside the llm, 1.00x alone; docs/benchmarks.md, generator-overlap-2026-12-02): 32 and 64
# streams in two groups, calls of up to 16 and 32 windows, alone and beside the llm, 2.5 s a run.
# Predicted: beside the llm 1.10-1.25x the windows a second at both sizes (HiFT's share of a call grows with its
# windows as the flow's fixed cost does not); alone 0.95-1.08x; the llm's step within +5% of its step beside the serial
# calls.
set -uo pipefail
source bench/wheel_site.sh >/dev/null
timeout 420 python3 bench/studies/generator_overlap.py --streams 32,64 --seconds 2.5 --beside-llm \
  --json "$OUT/generator_overlap_flow_limits.json" 2>&1 | grep -v '^{' | tail -22
