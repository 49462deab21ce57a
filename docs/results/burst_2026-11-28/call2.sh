#!/usr/bin/env bash
# The end of this entry's GPU checks on the tree (no llm, vocoder or encoder code changed since the last floor and peer
# runs: the gateway only): the llm against its floor and its peer (bench/gpu_smoke.sh bench), the flow against its
# floor (bench/codec_history.py), the codec's parity with the reference (tests/test_codec_parity.py; .whl with
# bench/wheels.sh --parity's wheels).
#   bash docs/results/burst_2026-11-28/call2.sh
#
# Predicted (written 2026-11-28 14:12 UTC, before the call; an H200): the llm 1.08-1.20x its floor at batch 1 / 64 /
# 128 (last: 1.11 / 1.15 / 1.18x), the peer's ratios within their spread; the flow's steady calls at 16 / 32 streams
# 6-10x their floor (last: 9.4 / 6.8x on an H100); the 6 parity tests pass.
set -uo pipefail
OUT=${OUT:-/tmp/out}
bash bench/gpu_smoke.sh bench 2>&1 | tail -30
source bench/wheel_site.sh
python3 bench/codec_history.py --streams 1,16,32 --json "$OUT/codec_history.json" 2>&1 | tail -12
python3 -m pytest -q -p no:cacheprovider tests/test_codec_parity.py 2>&1 | tee "$OUT/parity.log" | tail -4
