#!/usr/bin/env bash
# Run 2026-11-30 08:37 UTC (written 2026-11-30 07:35 UTC): the flow's honest floors beside the
# llm (issue 60's "time alone and beside the llm"): bench/codec_history.py --beside-llm failed in calls 1 and 2 of
# this directory (the llm child's loop ran past what its first sequences could decode) and was fixed on a CPU, not run
# again on a GPU.
#   bash docs/results/flow_2026-11-30/next_call16.sh
#
# Predicted (written 2026-11-30 07:35 UTC, before any run): alone as on 2026-11-29 (a first call 21.9-22.7 ms; steady
# 43-46 / 60-64 ms at 16 / 32 streams, 8.8-9.8x / 6.5-6.9x the FLOP floor; 548-605 kernels an Euler step); beside the
# llm (its share 25%) a first call 30-45 ms and steady calls 70-100 / 90-140 ms, the llm's step 10-13 ms against
# 6-7 ms alone.
source bench/wheel_site.sh
timeout 540 python3 bench/codec_history.py --streams 1,16,32 --modes history --kernels --beside-llm \
  --json "$OUT/call16_history.json" 2>&1 | grep -v Warning | tail -24
