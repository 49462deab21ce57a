#!/usr/bin/env bash
# Run 2026-11-30 08:54 UTC (at commit 295b864: since then the bench is bench/studies/stream_matmul.py, with the kernel,
# and bench/llm_engine.py has no --products): the llm's layer products at decode's few rows, cuBLAS against a
# weight-streaming Triton
# kernel (services/llm/runner/kernels/stream_matmul.py), alone (with a sweep of its configs) and under MPS at the
# llm's 25%; then the engine's decode step and prefill with each (bench/llm_engine.py --products).
#   bash docs/results/decode_2026-11-30/call1.sh
#
# Predicted (written 2026-11-30 08:54 UTC, before any run): the 36 layers' four products (13.9 GB) at the copy
# bandwidth (~4.25 TB/s) take 3.27 ms. cuBLAS: ~4.3 ms at 1 row (1.33x, as the step's 1.46x with its attention and
# head), ~5.2 ms at 64 (1.6x). The kernel: 3.6-4.0 ms at 1-16 rows (1.1-1.2x), 3.8-4.4 ms at 64. Under MPS at 25%
# (a quarter of the threads, spread over the GPU) both slower, the kernel no better than cuBLAS by more than 10%
# (a plain Triton stand-in was 14% slower at 32 rows there on an H100, 2026-11-27). The engine's decode step at
# batch 1 from 4.86 ms to 4.2-4.6 ms, at 64 from 6.24 to 5.2-5.8 ms; prefill unchanged (512 rows: cuBLAS).
source bench/wheel_site.sh
timeout 330 python3 bench/stream_matmul.py --mps-share 25 --json "$OUT/stream_matmul.json" 2>&1 | grep -v "^  .*Error\|Warning" | tail -40
for products in cublas stream; do
  timeout 110 python3 bench/llm_engine.py --preset moss-speech --device cuda --batches 1,64 --contexts 512 --prefills 512 \
    --no-peer --skip-check --max-seconds 100 --products $products --json "$OUT/llm_engine_$products.json" 2>&1 \
    | grep -E "^\| |decode|prefill" | tail -8
done
