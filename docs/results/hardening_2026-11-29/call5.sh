#!/usr/bin/env bash
# The llm against its floor and its peer, and the flow against its FLOP floor, side by side in one run each, on this
# tree (the scheduler's parked requests, the memory check at start, the fp8 format's module, the flow's history sized
# to free memory, the benches' shared timing moved into bench/measure.py). Everything in $OUT.
#   bash docs/results/hardening_2026-11-29/call5.sh
#
# Predicted (written 2026-11-29 08:40 UTC, before the call; an H200): the llm's decode at context 512 1.07-1.13x its
# floor at batch 1 / 64 / 128 and prefill 512 1.08-1.14x (2026-11-28: 1.08 / 1.10 / 1.11x, 1.10x); the peer's decode
# forward 5.3-7.5x slower (6.4 / 5.5 / 7.3x); the flow's steady calls at 16 / 32 streams 42-46 / 60-66 ms, 8.6-9.6x /
# 6.2-7.0x their floor (43.2 / 61.9 ms, 8.9x / 6.4x), a first call 23-26 ms.
set -uo pipefail
OUT=${OUT:-/tmp/out}
OUT="$OUT" timeout 330 bash bench/gpu_smoke.sh bench 2>&1 | tail -32
source bench/wheel_site.sh > /dev/null
timeout 150 python3 bench/codec_history.py --streams 1,16,32 --json "$OUT/codec_history.json" 2>&1 | tail -12
