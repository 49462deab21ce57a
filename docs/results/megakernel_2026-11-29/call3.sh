#!/usr/bin/env bash
# The voice prefix read once per voice in a call (chunk_attention.py's CASCADE, from 16 streams with a history):
# the attention's GPU tests, the flow's history tests, then steady calls with and without it.
#   bash docs/results/megakernel_2026-11-29/call3.sh
#
# Predicted (written 2026-11-29 09:50 UTC, before the call; an H200). Counted: at 32 streams each of a call's 560
# attentions has 64 rows x 8 heads x 80 queries read 140-160 prefix frames, 40 ring frames and up to 80 of their
# own; every (16-query block, row, head) program reads the prefix again (~50 MB from L2 an attention) in 16 x 16
# products. Read once per voice and CFG half, the prefix is 2 x 8 products of 2,560 x 64 by 64 x 160 an attention
# (~1.7 GFLOP, a few us), and the per-row kernel keeps the ring and the row's own keys (~120 of ~280): the
# attention ~34 -> ~18-22 us, a steady call of 32 streams 63.7 -> 55-59 ms; 16 streams (32 x 64 tiles) 43.2 -> 39-42
# ms; a first call unchanged (2 rows: no cascade). Two more kernels an attention at 16 and 32 streams (+1,120 a call).
set -uo pipefail
OUT=${OUT:-/tmp/out}
source bench/wheel_site.sh > /dev/null
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_chunk_attention.py tests/test_codec_history.py \
  tests/test_codec_solve.py 2>&1 | tee "$OUT/tests.log" | tail -4
timeout 280 python3 bench/codec_history.py --streams 1,16,32 --modes history --variants no-cascade,per-block \
  --kernels --json "$OUT/codec_history.json" 2>&1 | tee "$OUT/codec_history.log" | tail -8
