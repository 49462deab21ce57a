#!/usr/bin/env bash
# The fix of call 2's crash in the stack itself: a vocoder whose stream history has 8 slots (--flow-history-streams 8),
# so that from the 9th stream on its window calls capture their shapes while serving, beside the first-chunk lane's
# worker, as the fp8steps7 arm's did past 128 streams. 64 streams started over 6 s, one gateway at its defaults.
#   bash docs/results/ceiling_2026-11-28/call5.sh
#
# Predicted (written 2026-11-28 16:24 UTC, before the call; an H200): flow graphs captured while serving >= 1
# (logged), no ERROR or CRITICAL line, every turn answered (errors 0), the admitted ones >= 99% stall-free.
set -uo pipefail
OUT=${OUT:-/tmp/out}
env OUT="$OUT/h8" ONLY=a RATES= LEVELS=64 BURST=0 timeout "${ARM_SECONDS:-330}" \
  bash bench/overload.sh --flow-history-streams 8 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -2
head -3 "$OUT/h8/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
echo "  captured while serving: $(grep -c 'captured while serving' "$OUT/h8/up.log" 2> /dev/null);" \
  "ERROR or CRITICAL lines: $(grep -cE ' (ERROR|CRITICAL) ' "$OUT/h8/up.log" 2> /dev/null)"
grep -m3 'captured while serving' "$OUT/h8/up.log"
(cd "$OUT" && tar czf call5.tgz h8 && rm -rf h8)
