#!/usr/bin/env bash
# Written 2026-12-02 ~15:35 UTC, before any run.
#   bash docs/results/calls_2026-12-02/call11.sh      (carry .whl)
#
# Why: call10 measured the lazily kept max slower (history 32: 31.2 us against 25.7; a steady call of 32 streams
# 77.6 ms against 63.2 in graphs, 59.3 against 55.4 ms of kernel time eager). Nsight Compute said why: it executed
# 18% fewer instructions (10.9M against 13.3M), but took 98 registers a thread against 96, so a scheduler holds 4 of
# its one-warp programs instead of 5 (16 a multiprocessor against 20): 2,560 programs became 1.21 waves against 0.97,
# and the second wave's programs walk after the first's. Capped at 96 registers (ptxas's maxnreg; compiled here: no
# spills at 96 or 88) it keeps 20 a multiprocessor. And call10's graph timings had the second decoder slower whatever
# its variant (its first call 19.8 against 17.7 ms with the same kernels): the profile now runs each variant twice,
# in both orders.
# Predicted:
#   codec_kernels.py, history 32: "16x16 w1 lazy r96" 20-23 us against 25.7 (the instructions' 18% less, at the same
#     occupancy); r88 the same within 1 us; history 16's 64x32 w4 cells as in call10 (16.4-17.1).
#   codec_flow_profile.py, 32 streams, defaults / lazy-r96 / lazy-r96 / defaults: each pair of the same variant within
#     5% of each other; lazy-r96 1.5-3 ms faster than the defaults in graphs and eager (560 attentions of 3-5 us less);
#     the mel's SNR against the defaults 50-60 dB (call10: 54.8).
#   the flow's tests on the GPU with the tree (parity with the reference, the history's streaming): all pass.
source bench/wheel_site.sh
timeout 200 python3 bench/studies/codec_kernels.py --json "$OUT/attention_tiles.json" 2>&1 | tail -14
timeout 220 python3 bench/studies/codec_flow_profile.py --streams 32 \
  --variants defaults,attention-lazy-r96,attention-lazy-r96,defaults \
  --json "$OUT/flow_profile_r96.json" > "$OUT/flow_profile_r96.log" 2>&1
grep -E "^eager:|_chunk_attention" "$OUT/flow_profile_r96.log"
tail -10 "$OUT/flow_profile_r96.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_codec_parity.py tests/test_codec_history.py 2>&1 | tail -4
