#!/usr/bin/env bash
# The exact Euler-step solve (`--flow-solve on`: every in-flight row gathered each tick, solve_worker.py) in the stack
# on this tree, against the defaults (flow calls, the first-chunk lane), one arm a call: the ramp (256 started
# over 6 s) and Poisson 30 a second for 20 s, replies of 2-20 s, as bench/overload.sh runs them. Everything in
# $OUT/call2_<arm>.tgz.
#   ARM=solve bash docs/results/peer_2026-11-29/call2.sh     # then ARM=defaults
#
# Predicted (written 2026-11-29 12:20 UTC, before the call; an H200). A tick is an Euler step of every row in flight:
# ~560 kernels, ~4-7 ms beside the llm at 16-32 rows, so a first block waits 10 ticks plus the admissions between
# them, ~60-90 ms, against a first-chunk lane call of ~25-40 ms. The solve keeps the device busier (no call waits for
# the one in flight) but each tick is a small batch: 256 on the ramp 120-150 admitted (defaults 139-149 this morning),
# Poisson 30 350-430 of 600 (defaults 384-432), stall-free >= 99% in both; TTFA p95 higher with the solve (+20-60 ms).
set -uo pipefail
OUT=${OUT:-/tmp/out}
ARM=${ARM:?ARM=solve or ARM=defaults}
flags=()
[ "$ARM" = solve ] && flags=(--flow-solve on)
env OUT="$OUT/$ARM" ONLY=a RATES=30 LEVELS=256 BURST=0 timeout "${ARM_SECONDS:-560}" \
  bash bench/overload.sh "${flags[@]}" 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -3
cat "$OUT/$ARM/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
grep -m1 'admission: at most' "$OUT/$ARM/up.log"
grep -m2 -iE 'flow.solve|solve' "$OUT/$ARM/up.log"
echo "  ERROR or CRITICAL lines: $(grep -cE ' (ERROR|CRITICAL) ' "$OUT/$ARM/up.log" 2> /dev/null)"
(cd "$OUT" && tar czf "call2_$ARM.tgz" "$ARM" && rm -rf "$ARM")
