#!/usr/bin/env bash
# Written 2026-12-01 ~05:55 UTC, before this run: call2's outputs were read after a device synchronize on the primary
# context, which does not wait for a green context's stream (the eager reads, made on their own stream, agreed
# exactly; every graph's did not). The study now reads each output on the stream that made it, after waiting for it.
#   bash docs/results/llm_share_2026-12-01/call7.sh
#
# Predicted: every green graph's output equal to the whole GPU's graph's (max abs diff 0, or within bf16 rounding,
# <= 0.02, should cuBLAS choose other kernels on 40 multiprocessors); step times as call2's.
set -uo pipefail
timeout 400 python3 bench/studies/llm_share.py --check --json "$OUT/call7_check.json" > "$OUT/call7.log" 2>&1
echo "rc $?"; grep -E "^\[|Error|error|\| " "$OUT/call7.log" | grep -v "^frame" | cut -c1-300 | tail -30
