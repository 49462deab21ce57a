#!/usr/bin/env bash
# Call 8 (H100): the other loads with the cheaper flow and FP8: 256 streams started over 6 s, then 128 at once.
set -uo pipefail
OUT=${OUT:-/tmp/out}
OUT=$OUT/ramp ONLY=a RATES="" LEVELS=256 BURST=128 timeout 300 bash bench/overload.sh --flow-steps 5 --quantization fp8 \
  --admit-initial-turns 96 2>&1 | grep -E "^(level|burst|a )|rror" | head -12
(cd "$OUT/ramp" && grep -h "admission limit" up.log | tail -4)
(cd "$OUT" && tar czf ramp.tgz ramp && rm -rf ramp)
