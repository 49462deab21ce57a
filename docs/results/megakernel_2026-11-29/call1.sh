#!/usr/bin/env bash
# The estimator's transformer blocks, a U-Net level's in one persistent launch (codec/megakernel.py): checked against
# the per-block path on the GPU (its grid barrier in one launch), the codec's GPU tests on the new default, then the
# flow's calls with and without it, their kernels counted, against the FLOP floor. Everything in $OUT.
#   bash docs/results/megakernel_2026-11-29/call1.sh
#
# Predicted (written 2026-11-29 09:10 UTC, before the call; an H200). Counted: an Euler step is ~600 kernels today,
# ~450 of them the 56 transformer blocks' (8 each); with a level's blocks in one launch, 14 launches replace those:
# ~165 kernels a step. A launch runs 27 stages (4 blocks x 7 - 1) with a grid barrier between two (~1-1.5 us each
# on 132 programs) and little work each at a first call's 2 x ~40 rows, so a level's blocks take ~3 us a stage,
# ~80 us, against ~105 us as 32 kernels: a first call 23.8 -> 18-22 ms. A steady call of 32 streams (5,120 rows) is
# bound by its work, not its launches, and the kernel's products are Triton's tiles of 64 x 64 without pipelining
# across tiles, its attention a walk per (query block, row, head) as before, and ptxas reports 255 registers with
# 1.6 KB of spills (the stages' addresses hoisted out of the stage loop): 55-80 ms against 60.7, 5.7-8.3x the floor.
# Correctness: the real-size run of 4 blocks >= 40 dB against the per-block path; the flow's mel through it against
# the per-block path's >= 40 dB.
set -uo pipefail
OUT=${OUT:-/tmp/out}
source bench/wheel_site.sh > /dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
echo "== megakernel tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_megakernel.py 2>&1 | tee "$OUT/tests_megakernel.log" | tail -8
echo "== codec GPU tests on the new default"
timeout 300 python3 -m pytest -q -p no:cacheprovider -x tests/test_codec_history.py tests/test_codec_solve.py \
  tests/test_codec_prefix.py tests/test_codec_stream.py tests/test_chunk_attention.py 2>&1 | tee "$OUT/tests_codec.log" | tail -8
echo "== flow calls"
timeout 420 python3 bench/codec_history.py --streams 1,16,32 --modes history --variants per-block,megakernel \
  --kernels --json "$OUT/codec_history.json" 2>&1 | tee "$OUT/codec_history.log" | tail -14
