#!/usr/bin/env bash
# The codec's and the encoder's GPU tests on this tree (the flow's stream history is now sized to the GPU's free
# memory before it is allocated: codec/decoder.py's set_voices; the encoder's places likewise), without the parity
# oracle's wheels (its 6 tests skip: the parity code did not change).
#   bash docs/results/hardening_2026-11-29/call3.sh
#
# Predicted (written 2026-11-29 07:14 UTC, before the call; an H200): every test passes (the previous entry's 302 with the
# oracle's wheels, less its 6 parity tests, skipped here).
set -uo pipefail
OUT=${OUT:-/tmp/out}
OUT="$OUT" timeout 540 bash bench/gpu_smoke.sh tests-codec 2>&1 | tail -4
