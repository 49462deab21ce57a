#!/usr/bin/env bash
# Every codec and encoder GPU test on this tree (bench/gpu_smoke.sh tests-codec, the codec's parity with the reference
# among them: .whl with bench/wheels.sh --parity's wheels), then the llm against its floor and its peer side by side
# (bench/gpu_smoke.sh bench) and the flow against its floor (bench/codec_history.py). The last full run of the codec's
# GPU tests was before the eager fallback (2026-11-28, 297 passed); its final form (6f18e06) ran on a GPU only in
# call 1's tests and stack.
#   bash docs/results/eager_2026-11-28/call2.sh
#
# Predicted (written 2026-11-28 17:53 UTC, before the call; an H200): every codec test passes (~300, ~300 s); the llm
# 1.08-1.20x its floor at decode batch 1 / 64 / 128 (the previous entry 1.09 / 1.08 / 1.10x), the peer 5-7x; the flow's steady
# calls at 16 / 32 streams 6-10x their floor (the previous entry 9.7 / 6.9x).
set -uo pipefail
OUT=${OUT:-/tmp/out}
bash bench/gpu_smoke.sh tests-codec 2>&1 | tail -6
bash bench/gpu_smoke.sh bench 2>&1 | tail -30
source bench/wheel_site.sh
python3 bench/codec_history.py --streams 1,16,32 --json "$OUT/codec_history.json" 2>&1 | tail -12
