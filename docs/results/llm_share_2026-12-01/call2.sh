#!/usr/bin/env bash
# Written 2026-12-01 ~06:15 UTC after call1, before this run: call1's graphs captured on the green context ran at the
# 25% share's speed, but their output disagreed with the whole GPU's (max abs diff 4.06 against a max of 3.58).
#   bash docs/results/llm_share_2026-12-01/call2.sh
#
# (Run 2, after a first try faulted: the recapture ran on step buffers that still held a prefill's rows; they are padded
# first now, and the outputs compared on one fixed row.)
# Predicted: cuBLAS is what goes wrong on 33 multiprocessors it did not choose its kernels for (as at some MPS
# shares): matmul_check "green" wrong, "green carveout" right; the outputs: whole again 0, eager whole ~0, eager
# green and graph green wrong (~4), green carveout within bf16 rounding (<= 0.05), no-pdl as its PDL twin. Step times
# with the carveout within 5% of call1's green (6.22 / 8.11 ms), the vocoder beside it as beside green (72.6 ms).
set -u
timeout 500 python3 bench/studies/llm_share.py --check --json "$OUT/call2_check.json" > "$OUT/call2.log" 2>&1
echo "rc $?"; grep -E "^\[|Error|error|\| " "$OUT/call2.log" | grep -v "^frame" | cut -c1-400 | tail -40
