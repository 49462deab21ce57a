#!/usr/bin/env bash
# Call 5 (the session's last device seconds): one stack at Poisson 30 with the admission rule's TTFA target at 0.29 s.
set -uo pipefail
OUT=${OUT:-/tmp/out}
OUT=$OUT/t29 ONLY=a RATES=30 LEVELS="" BURST=0 timeout 255 bash bench/overload.sh --admit-ttfa 0.29 2>&1 \
  | grep -E "^rate|^a |streams|ready|rror" | head -12
(cd "$OUT/t29" && mkdir -p r && tar xzf results.tgz -C r && python3 "$OLDPWD/docs/results/handoffs_2026-11-27/tail.py" \
  r/a/poisson_30/bench.json; grep -h "admission limit" up.log | head -8; rm -rf r)
(cd "$OUT" && tar czf t29.tgz t29 && rm -rf t29)
