#!/usr/bin/env bash
# The llm's GPU tests (they did not fit call 1's time), then Poisson 30 again on the defaults (call 1 admitted 384 of
# 600, under its predicted 405-440, with the same per-turn latencies as the previous entry: every refusal the headroom
# rule's). Everything in $OUT/call2.tgz.
#   bash docs/results/hardening_2026-11-29/call2.sh
#
# Predicted (written 2026-11-29 07:10 UTC, before the call; an H200): the llm's GPU tests pass (153 and 1 skipped, as
# the previous entry, plus none new: the held-request tests are CPU ones); Poisson 30 380-440 of 600, >= 99% stall-free,
# TTFA p95 265-285 ms, every refusal by headroom.
set -uo pipefail
OUT=${OUT:-/tmp/out}
OUT="$OUT" timeout 230 bash bench/gpu_smoke.sh tests-llm 2>&1 | tail -4
env OUT="$OUT/again" ONLY=a RATES=30 LEVELS= BURST=0 timeout "${ARM_SECONDS:-300}" \
  bash bench/overload.sh 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -3
cat "$OUT/again/overload.txt" 2> /dev/null | head -4 || echo "  (no report: the arm did not finish)"
grep -m1 'admission: at most' "$OUT/again/up.log"
echo "  ERROR or CRITICAL lines: $(grep -cE ' (ERROR|CRITICAL) ' "$OUT/again/up.log" 2> /dev/null)"
(cd "$OUT" && tar czf call2.tgz again && rm -rf again)
