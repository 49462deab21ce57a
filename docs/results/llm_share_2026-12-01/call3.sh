#!/usr/bin/env bash
# Written 2026-12-01 ~06:05 UTC, before the run: the llm's share following the load, in the stack (gpu_share.py).
# First its GPU tests and the llm's runner tests it touches, then the stack with it on (arm.sh; call4.sh: off).
#   bash docs/results/llm_share_2026-12-01/call3.sh
#
# Predicted: test_gpu_share 5 passed (the same tokens on the share, and moving every step); test_overlap and
# test_kernel_runner pass. One stream: TTFA p50 74-80 ms against off's 86-90 (call4), the llm's first chunk 52-56 ms
# against 60-64 (its 7 decode steps 4.9 against 6.2 ms, its prefill 9-11 against 13-14); every step of the one-stream
# turns on the whole GPU but the warm-up's. 256 over 6 s: admitted within 10 of off's, >= 99% stall-free, TTFA p95
# within 15 ms of off's; nearly every step on the share.
set -uo pipefail
bash docs/results/gpu_tests_2026-11-30/run_files.sh 150 110 tests/test_gpu_share.py tests/test_overlap.py \
  tests/test_kernel_runner.py
ARM=on N=3 timeout 420 bash docs/results/llm_share_2026-12-01/arm.sh
