#!/usr/bin/env bash
# Written 2026-11-30 ~18:10 UTC, before any run (this session had no device time left): a transformer block in five
# kernels where prefetch_linear's kernel runs (norm1 inside q|k|v's product, the residual and the kept keys inside the
# output product, norm3 inside the feed-forward's first, the residual inside its second) and a convolution of 256
# channels in one (its product reads its taps), against prefetch-2026-11-30's seven and two (`prefetch-apart`). First the tests that need a GPU for the change, then the chain study, then
# whole flow calls in both orders (a second decoder's first call measures slower), alone and beside the llm's decode,
# with their kernel counts.
#   bash docs/results/fold_2026-11-30/call1.sh   # the tests and the chain study
#   bash docs/results/fold_2026-11-30/call2.sh   # whole flow calls
#
# Predicted (docs/benchmarks.md, fold-2026-11-30): the chain of 56 blocks at 80 frames 13.3 → 9.5-10.5 us a block
# (0.72-0.79x; at 160 14.6 → 10.5-11.5); kernels per Euler step 548-604 → 407-463 (56 blocks x 2, 29 convolutions);
# a stream's first call alone 18.7-19.0 → 15.9-17.0 ms, beside the llm 23.7-24.1 → 20.5-22 ms; its steady call 21.8
# → 19-20 ms; 4 streams (320 / 640 frames: cuBLAS's products, not folded) unchanged within ±3%; mel SNR folded against
# apart ≥ 45 dB; the llm's step beside unchanged (11.4-11.5 ms).
source bench/wheel_site.sh
timeout 200 python3 -m pytest -q -x tests/test_prefetch_linear.py tests/test_frame_ops.py tests/test_codec_parity.py \
  tests/test_megakernel.py 2>&1 | tail -4
timeout 120 python3 bench/studies/prefetch_linear.py --frames 80,160,320 --json "$OUT/call1_study.json" 2>&1 \
  | grep -v Warning | tail -24
