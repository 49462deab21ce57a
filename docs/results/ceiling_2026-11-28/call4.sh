#!/usr/bin/env bash
# The end of this entry's GPU checks on the tree (the vocoder's captures now in CUDA's thread-local mode:
# services/common/graph_capture.py; no llm code changed): the llm against its floor and its peer (bench/gpu_smoke.sh
# bench), the flow against its floor (bench/codec_history.py), the codec's parity with the reference
# (tests/test_codec_parity.py; .whl with bench/wheels.sh --parity's wheels).
#   bash docs/results/ceiling_2026-11-28/call4.sh
#
# Predicted (written 2026-11-28 16:21 UTC, before the call; an H200): the llm 1.08-1.20x its floor at batch 1 / 64 /
# 128 (the previous entry: 1.08 / 1.10 / 1.10x), its peer 5-7x; the flow's steady calls at 16 / 32 streams 6-10x their floor
# (the previous entry: 9.2 / 6.6x); the 6 parity tests pass.
# (The tree it ran on had the thread-local capture that was taken out after call 5; the code kept changes only
# what a vocoder call does once serving, which these benches never reach.)
set -uo pipefail
OUT=${OUT:-/tmp/out}
bash bench/gpu_smoke.sh bench 2>&1 | tail -30
source bench/wheel_site.sh
python3 bench/codec_history.py --streams 1,16,32 --json "$OUT/codec_history.json" 2>&1 | tail -12
python3 -m pytest -q -p no:cacheprovider tests/test_codec_parity.py 2>&1 | tee "$OUT/parity.log" | tail -4
