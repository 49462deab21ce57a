#!/usr/bin/env bash
# Written 2026-12-02 ~16:05 UTC, before any run.
#   bash docs/results/calls_2026-12-02/call12.sh      (carry .whl, with bench/wheels.sh --parity's)
#
# The small tile kept lazily at 96 registers, now the default from 6 streams (chunk_attention.SMALL_TILE,
# SMALL_TILES_FROM 96), against the defaults before (`attention-every-block`: the small tile rescaling every block,
# from 32 streams only), each twice in both orders; then every codec GPU test on the tree.
# Predicted (call11's tiles: 24.2 against 25.7 us at 32 streams, 15.2 against 17.0 at 16, 10.2 against 12.9 at 6):
#   eager kernel time a steady call, the defaults against every-block: 32 streams 0.6-1.2 ms less (call11: 0.8);
#     16 streams 0.7-1.3 ms less; 6 streams 1.0-1.8 ms less; a first call unchanged (its tile is not the small one).
#   graph times: the same differences, inside the order's spread unless the pair agrees (call11: 60.5-67.4 ms for one
#     variant at 32 streams).
#   the mel's SNR between the two: 50-60 dB (call11: 54.8).
#   bench/gpu_smoke.sh tests-codec: every test passes, parity with the reference included (its wheels carried).
source bench/wheel_site.sh
timeout 260 python3 bench/studies/codec_flow_profile.py --streams 6,16,32 \
  --variants defaults,attention-every-block,attention-every-block,defaults \
  --json "$OUT/flow_profile_small_tile.json" > "$OUT/flow_profile_small_tile.log" 2>&1
grep -E "^eager:|_chunk_attention" "$OUT/flow_profile_small_tile.log"
tail -18 "$OUT/flow_profile_small_tile.log"
timeout 320 bash bench/gpu_smoke.sh tests-codec 2>&1 | tail -12
