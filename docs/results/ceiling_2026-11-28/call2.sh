#!/usr/bin/env bash
# Which of the trades the issue's loads need. Call 1 (every trade: FP8, 3 Euler steps, the limit from 128 grown by
# TTFA's room) served Poisson 30 600 of 600 (TTFA p95 143 ms) and the 256 ramp 256 of 256 (190 ms), all stall-free,
# on an H200. Each arm here keeps the admission flags and one or both trades smaller; a stack of its own, one
# gateway, the outside client's loads (Poisson 30/s for 20 s, then 256 started over 6 s; replies of 2-20 s).
#   ARMS="fp8steps7 steps5" bash docs/results/ceiling_2026-11-28/call2.sh
#
# Predicted (written 2026-11-28 16:04 UTC, before the call; an H200):
# - fp8steps7 (--quantization fp8 --flow-steps 7): the llm's first chunk 90-105 ms, the vocoder's side 45-60 ms;
#   Poisson 30 590-600 of 600 (TTFA p95 180-230 ms), the ramp 225-256 of 256 (p95 210-260 ms), >= 99% stall-free.
# - steps5 (--flow-steps 5, the llm in bf16): the llm's 125-145 ms, the vocoder's 35-50 ms; Poisson 30 540-600 (p95
#   220-270 ms), the ramp 185-235 (p95 240-290 ms).
# - fp8 (--quantization fp8, 10 steps), if run: Poisson 30 480-580, the ramp 170-215.
set -uo pipefail
OUT=${OUT:-/tmp/out}
admit=(--admit-initial-turns 128 --admit-growth 0.4)
for arm in ${ARMS:-fp8steps7 steps5}; do
  case $arm in
    fp8steps7) flags=(--quantization fp8 --flow-steps 7) ;;
    steps5) flags=(--flow-steps 5) ;;
    fp8) flags=(--quantization fp8) ;;
    steps7) flags=(--flow-steps 7) ;;
    *) echo "unknown arm $arm"; exit 2 ;;
  esac
  echo "=== arm $arm: moss-serve up ${flags[*]} ${admit[*]}"
  env OUT="$OUT/$arm" ONLY=a RATES=30 LEVELS=256 BURST=0 timeout "${ARM_SECONDS:-280}" \
    bash bench/overload.sh "${flags[@]}" "${admit[@]}" 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -2
  head -4 "$OUT/$arm/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
  sed -n '/band/,/^$/p' "$OUT/$arm/overload.txt" 2> /dev/null
  for f in $(tar tzf "$OUT/$arm/results.tgz" 2> /dev/null | grep -E "^\./a/metrics_[0-9]+_"); do
    echo "  $f: $(tar xzf "$OUT/$arm/results.tgz" -O "$f" | grep -E "^gateway_(headroom_refusals_total|admission_limit) " | paste -sd' ')"
  done
  echo "  captured while serving: $(grep -c 'captured while serving' "$OUT/$arm/up.log" 2> /dev/null);" \
    "ERROR or CRITICAL lines: $(grep -cE ' (ERROR|CRITICAL) ' "$OUT/$arm/up.log" 2> /dev/null)"
done
(cd "$OUT" && tar czf ${TGZ:-call2.tgz} ${ARMS:-fp8steps7 steps5} && rm -rf ${ARMS:-fp8steps7 steps5})
