#!/usr/bin/env bash
# Call 9 (H100): this tree at Poisson 30/s with the llm's layer products in FP8 (--quantization fp8, off by default),
# then in bf16 (the default), one after the other on one machine. Each run's files packed into one.
set -uo pipefail
for q in fp8 none; do
  echo "== $q"
  OUT=$OUT/$q ONLY=a RATES=30 LEVELS="" BURST=0 timeout 270 bash bench/overload.sh --quantization $q > $OUT/$q.log 2>&1
  tail -1 $OUT/$q/overload.txt 2>/dev/null
  grep "admission limit" $OUT/$q/up.log 2>/dev/null | tail -4
  (cd $OUT && tar czf ${q}.tgz $q && rm -rf $q)
done
