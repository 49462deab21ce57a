#!/usr/bin/env bash
# Written 2026-11-30 ~18:00 UTC with call1.sh, before any run: whether the folded kernel should run past 160 frames.
# The stack's flow calls are ~6 streams' windows (~960 frames a CFG pair), where today cuBLAS's products and the
# per-frame kernels run (prefetch-2026-11-30: the kernel alone lost past 640 frames). `prefetch-all` runs the kernel,
# folded, at every size: the per-frame kernels it removes cost more there (each reads and writes every frame).
#   bash docs/results/fold_2026-11-30/call3.sh
#
# Predicted: at 6 streams' steady call (960 frames) prefetch-all 0.85-1.0x prefetch's time, at 16 (2,560) 0.95-1.15x,
# at 32 (5,120) 1.1-1.5x (its tiles reload the weight slice in every frame tile); mel SNR against prefetch ≥ 45 dB.
source bench/wheel_site.sh
timeout 560 python3 bench/codec_history.py --streams 6,16,32 --modes history \
  --variants prefetch,prefetch-all,prefetch-all,prefetch --kernels --json "$OUT/call3_history.json" \
  2>&1 | grep -v Warning | tail -24
