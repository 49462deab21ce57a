#!/usr/bin/env bash
# Call 2: the stack at Poisson 30 with the first-chunk lane's workers as given (ARMS, in order), one stack each.
set -uo pipefail
OUT=${OUT:-/tmp/out}
for arm in ${ARMS:-2 1}; do
  OUT=$OUT/lanes$arm ONLY=a RATES=30 LEVELS="" BURST=0 timeout 285 bash bench/overload.sh --first-chunk-lanes "$arm" 2>&1 \
    | grep -E "^rate|^a |streams|ready|Error|error" | head -12
  (cd "$OUT/lanes$arm" && mkdir -p r && tar xzf results.tgz -C r && python3 "$OLDPWD/docs/results/handoffs_2026-11-27/tail.py" \
    r/a/poisson_30/bench.json; grep -h "vocoder_first_chunk_seconds_sum\|vocoder_first_chunk_seconds_count\|vocoder_batch_seconds_sum\|vocoder_batch_size_count" r/a/metrics_vocoder_01_poisson_30.txt)
  (cd "$OUT" && tar czf "lanes$arm.tgz" "lanes$arm" && rm -rf "lanes$arm")
done
