#!/usr/bin/env bash
# Written 2026-12-01 ~05:50 UTC after calls 3-4, before this run: the rule now puts a step with more than
# --whole-gpu-turns sequences on the share at once (before, with no quiet spell, never: the GPU test that moves every
# step failed on it; the stack's 2 s spell hid it). Its GPU tests again, then one stream again with the share
# following the load (24 turns; call6.sh: fixed).
#   bash docs/results/llm_share_2026-12-01/call5.sh
#
# Predicted: test_gpu_share 6 passed; TTFA p50 72-78 ms (call3: 74.0), the llm's first chunk 50-55 ms.
set -uo pipefail
bash docs/results/gpu_tests_2026-11-30/run_files.sh 80 70 tests/test_gpu_share.py
ARM=on N=5 REQUESTS=24 RAMP=0 timeout 300 bash docs/results/llm_share_2026-12-01/arm.sh
