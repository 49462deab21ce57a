#!/usr/bin/env bash
# The stack at its defaults on this tree, as a user starts it (`moss-serve up --device cuda --preset moss-speech
# --kv-cache-gb 32 --max-num-seqs 256`), now that `up` gives the gateway --max-turns 128 (the flow's stream-history
# slots; the gateway's new start-up line says what it admits by), and the vocoder falls back to eager calls for a
# shape the warm-up missed (none expected here). The issue's loads: Poisson 30/s for 20 s, 256 started over 6 s, 128
# at the same instant. Everything in $OUT/call3.tgz.
#   bash docs/results/eager_2026-11-28/call3.sh
#
# Predicted (written 2026-11-28 17:54 UTC, before the call; an H200): the gateway's line says headroom from 48 turns,
# at most 128 running, 16 starting; Poisson 30 405-440 of 600 and the ramp 140-155 of 256 (the earlier entries: 412-432 and
# 147-149), >= 99% stall-free, TTFA p95 270-290 ms; 128 at once all admitted (the burst rule), 94-100% stall-free; no
# flow call run eagerly, no ERROR line.
set -uo pipefail
OUT=${OUT:-/tmp/out}
env OUT="$OUT/defaults" ONLY=a RATES=30 LEVELS=256 BURST=128 timeout "${ARM_SECONDS:-500}" \
  bash bench/overload.sh 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -3
cat "$OUT/defaults/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
grep -m1 'admission by' "$OUT/defaults/up.log"
echo "  run eagerly: $(grep -c 'run eagerly' "$OUT/defaults/up.log" 2> /dev/null);" \
  "ERROR or CRITICAL lines: $(grep -cE ' (ERROR|CRITICAL) ' "$OUT/defaults/up.log" 2> /dev/null)"
(cd "$OUT" && tar czf call3.tgz defaults && rm -rf defaults)
