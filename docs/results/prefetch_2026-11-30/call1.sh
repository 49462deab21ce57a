#!/usr/bin/env bash
# Run 2026-11-30 ~14:30 UTC (written 2026-11-30 14:28 UTC): the estimator's products with their weights read before the
# launch wait (codec/prefetch_linear.py), issue 60. On the GPU: the kernel's tests, each product alone and the 56
# blocks' chain against cuBLAS's (bench/studies/prefetch_linear.py), then whole flow calls through it.
#   bash docs/results/prefetch_2026-11-30/call1.sh
#
# Predicted (written 2026-11-30 14:28 UTC, before any run):
# - alone, at 80 frames: the kernel 0.5-0.8x cuBLAS's time a product (its weights load while the replay before it
#   runs); at 1,280-2,560 frames 1.2-2x slower (a program's 16-32 channels, its weight slice loaded by every frame tile).
# - the chain, per block without its attention (6 kernels): cuBLAS ~16-18 us at 80 frames (the per-block path's
#   ~2.6 us a kernel, megakernel-2026-11-29), the kernel 10-12 us (0.6-0.75x); ~0.8x at 320; no gain from 1,280.
# - a flow call (bench/codec_history.py): a first call of one stream 21.9-24.5 ms → 17-20 ms with `prefetch`; the
#   same kernels a step (548-604); steady calls of 16 and 32 streams unchanged (over MAX_ROWS: cuBLAS's), slower
#   with `prefetch-all`; mel against per-block ≥ 40 dB.
source bench/wheel_site.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_prefetch_linear.py tests/test_fused_linear.py 2>&1 | tail -4
timeout 170 python3 bench/studies/prefetch_linear.py --json "$OUT/call1_study.json" 2>&1 | grep -v Warning | tail -34
timeout 260 python3 bench/codec_history.py --streams 1,4,16,32 --modes history --variants per-block,prefetch,prefetch-all \
  --kernels --json "$OUT/call1_history.json" 2>&1 | grep -v Warning | tail -30
