#!/usr/bin/env bash
# Written 2026-12-01 ~11:20 UTC, before this run: the llm's GPU tests file by file (test_gpu_share and the green
# context's split, made the bench's and the service's one function in 749a915, never run on a GPU since), then the
# llm's benchmark against its cuBLAS floor, its roofline and the transformers peer (bench/gpu_smoke.sh bench), owed
# since 2026-11-29.
#   bash docs/results/defaults_2026-12-01/call1.sh
#
# Predicted: every llm GPU test passes (test_gpu_share 6, as in llm_share_2026-12-01 call 5). The benchmark as on
# 2026-11-29 (no llm kernel changed since; the engine now captures a second graph set only with --busy-share, which
# the bench does not pass): decode 1.05-1.12x its cuBLAS floor and 1.35-1.50x its roofline at batch 1 / 64 / 128,
# prefill of 512 1.1-1.3x its floor; the peer 5-10x slower.
set -uo pipefail
bash docs/results/gpu_tests_2026-11-30/run_files.sh 300 120 tests/test_gpu_share.py tests/test_paged_attention.py \
  tests/test_fused_kernels.py tests/test_kernel_runner.py tests/test_fp8.py tests/test_sampler.py tests/test_overlap.py \
  tests/test_text_skip.py tests/test_pacing.py
timeout 270 bash bench/gpu_smoke.sh bench 2>&1 | tail -45
