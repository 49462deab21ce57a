#!/usr/bin/env bash
# A burst on an idle stack let in over the headroom limit (--admit-burst-turns, default 128: services/gateway/
# headroom.py), issue 23's third target (128 streams started at the same instant, >= 99% stall-free) at the defaults.
# Each arm is a stack of its own (moss-serve up at its defaults plus the arm's flags: MPS with the llm at 25%, random
# weights, the codec's decoder), one gateway, the outside client's loads (replies of 2-20 s), the arms in ARMS' order
# on one machine. Everything each arm leaves ends up in $OUT/call.tgz (a device call brings back only a few files).
#   [ARMS="defaults start32"] bash docs/results/burst_2026-11-28/call.sh
# defaults: Poisson 30/s for 20 s, 256 started over 6 s (do the sustained loads see the burst rule? they should not),
#           then 128 at the same instant, then 256 at the same instant (each on the idle stack);
# start32:  --max-starting-turns 32: 128 at the same instant (is the start limit of 16 what makes a burst's first
#           audio late?).
#
# Predicted (written 2026-11-28 13:29 UTC, before the call; an H200, whose defaults gave 412 of 600 and 147 of 256):
# - defaults: Poisson 30 380-430 of 600, 100% stall-free, TTFA p95 260-285 ms, no turn let in by the burst rule; the
#   ramp 130-155 of 256, none by the burst rule. 128 at once: 128 admitted (~80 of them over a limit of ~40-50),
#   99-100% stall-free, TTFA at the client p50 1.0-1.4 s / p95 2.0-2.6 s (the wait to start, 16 at a time). 256 at
#   once: 128 admitted, 99-100% stall-free, 128 refused with a hint, the slowest refusal 100-250 ms (each behind the
#   admitted turns' starts, ~1 ms each on this host).
# - start32: 128 of 128, 97-100% stall-free, TTFA p50 0.7-1.0 s / p95 1.3-1.8 s.
set -uo pipefail
OUT=${OUT:-/tmp/out}
for arm in ${ARMS:-defaults start32}; do
  case $arm in
    defaults) flags=(); loads=(RATES=30 LEVELS=256 BURST=128,256) ;;
    start32) flags=(--max-starting-turns 32); loads=(RATES= LEVELS= BURST=128) ;;
    *) echo "unknown arm $arm"; exit 2 ;;
  esac
  echo "=== arm $arm: moss-serve up ${flags[*]}; ${loads[*]}"
  env OUT="$OUT/$arm" ONLY=a "${loads[@]}" timeout "${ARM_SECONDS:-330}" bash bench/overload.sh "${flags[@]}" 2>&1 \
    | grep -vE "^\s*$|it/s|%\|" | tail -2
  cat "$OUT/$arm/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
  for f in $(tar tzf "$OUT/$arm/results.tgz" 2> /dev/null | grep -E "^\./a/metrics_[0-9]+_"); do  # the gateway's counters
    echo "  $f: $(tar xzf "$OUT/$arm/results.tgz" -O "$f" | grep -E "^gateway_(burst_admissions_total|headroom_refusals_total|admission_limit) " | paste -sd' ')"
  done
  echo "  captured while serving: $(grep -c "captured while serving" "$OUT/$arm/up.log" 2> /dev/null)"
done
(cd "$OUT" && tar czf call.tgz ${ARMS:-defaults start32} && rm -rf ${ARMS:-defaults start32})
# Call 1 (H200, 334 s; call1.tgz): defaults: Poisson 30 432 of 600, 99.3% stall-free (3 streams sent 7.6 s in, each
# 31 ms late on its second chunk), TTFA p95 277 ms, none let in by the burst rule; the ramp 149 of 256, 100%, 282 ms,
# none by it; 128 at once 128 of 128 (77 over a limit of ~51), 100%, TTFA 1184 / 2330 ms; 256 at once 128 admitted,
# 100%, 128 refused with a hint, the slowest 59 ms. start32: 128 of 128, 100%, 1262 / 2371 ms (the vocoder's first
# chunks then wait where the start limit's queue was: no faster).
