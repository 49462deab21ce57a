#!/usr/bin/env bash
# Written 2026-11-30 ~18:10 UTC, before any run (no device time was left on 2026-11-30): a transformer block in five
# kernels where prefetch_linear's kernel runs (norm1 inside q|k|v's product, the residual and the kept keys inside the
# output product, norm3 inside the feed-forward's first, the residual inside its second) and a convolution of 256
# channels in one (its product reads its taps), a resnet block's res_conv inside its first convolution's product,
# against prefetch-2026-11-30's kernels (`prefetch-apart`). First the tests that need a GPU for the change, then the chain study, then
# whole flow calls in both orders (a second decoder's first call measures slower), alone and beside the llm's decode,
# with their kernel counts.
#   bash docs/results/fold_2026-11-30/call1.sh   # the tests and the chain study
#   bash docs/results/fold_2026-11-30/call2.sh   # whole flow calls
#
# Predicted (docs/benchmarks.md, fold-2026-11-30): the chain of 56 blocks at 80 frames 13.3 → 9.5-10.5 us a block
# (0.72-0.79x; at 160 14.6 → 10.5-11.5); kernels per Euler step 548-604 → 394-450 (56 blocks x 2, 29 convolutions,
# 13 resnets); a stream's first call alone 18.7-19.0 → 15.6-16.7 ms, beside the llm 23.7-24.1 → 20-21.5 ms; its
# steady call 21.8 → 18.5-19.7 ms; 4 streams (320 / 640 frames: cuBLAS's products, not folded) unchanged within ±3%; mel SNR folded against
# apart ≥ 45 dB; the llm's step beside unchanged (11.4-11.5 ms).
source bench/wheel_site.sh
timeout 150 python3 -m pytest -q -x tests/test_prefetch_linear.py tests/test_frame_ops.py tests/test_codec_parity.py \
  tests/test_megakernel.py 2>&1 | tail -4
timeout 100 python3 bench/studies/prefetch_linear.py --frames 80,160,320 --json "$OUT/call1_study.json" 2>&1 \
  | grep -v Warning | tail -24
# where a first call's time and kernels go, folded and unfolded (the top 15 kernels by time, and the counts)
timeout 200 python3 bench/studies/codec_flow_profile.py --streams 1 --variants defaults,unfolded \
  --json "$OUT/call1_profile.json" 2>&1 | grep -v Warning | tail -60
