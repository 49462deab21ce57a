#!/usr/bin/env bash
# What a cheaper flow would buy (issue 23; a quality trade nobody has heard: not a default): one stack each at
# Poisson 30, one after the other on one machine. ARMS: name=flags;name=flags (flags go to moss-serve up).
set -uo pipefail
OUT=${OUT:-/tmp/out}
IFS=';' read -ra arms <<< "${ARMS:-steps5=--flow-steps 5;steps5_fp8=--flow-steps 5 --quantization fp8}"
for arm in "${arms[@]}"; do
  name=${arm%%=*}; flags=${arm#*=}
  echo "== $name: $flags"
  OUT=$OUT/$name ONLY=a RATES=30 LEVELS="" BURST=0 timeout ${STACK_SECONDS:-280} bash bench/overload.sh $flags 2>&1 \
    | grep -E "^rate|^a |rror" | head -8
  (cd "$OUT/$name" && mkdir -p r && tar xzf results.tgz -C r && python3 "$OLDPWD/docs/results/handoffs_2026-11-27/tail.py" \
    r/a/poisson_30/bench.json; grep -h "admission limit" up.log | tail -3; rm -rf r)
  (cd "$OUT" && tar czf "$name.tgz" "$name" && rm -rf "$name")
done
