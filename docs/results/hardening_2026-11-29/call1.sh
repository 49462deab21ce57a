#!/usr/bin/env bash
# The stack at its defaults on this tree, as a user starts it (`moss-serve up --device cuda --preset moss-speech
# --kv-cache-gb 32 --max-num-seqs 256`), now that each service sizes what it allocates to its GPU's free memory
# (services/common/memory.py), `up` no longer gives the gateway --max-turns, and the gateway caps the turns running at
# the stream slots its vocoder reports. Then the llm's GPU tests (its scheduler's parked list: held requests leave the
# running batch). Everything in $OUT/call1.tgz.
#   bash docs/results/hardening_2026-11-29/call1.sh
#
# Predicted (written 2026-11-29 07:00 UTC, before the call; an H200, 139 GiB): no service refuses to start; the
# vocoder keeps its 128 streams' histories (11.8 GB of ~80 GB free beside the llm's 17 GB of weights and 32 GiB of KV:
# under half) and no "holds N streams, not 128" line; the gateway logs "admission: at most 128 turns running (the
# vocoders' 128 stream slots, under --max-turns 256)"; Poisson 30 405-440 of 600 and the ramp 140-155 of 256 (the last
# stops: 412-432 and 145-149), >= 99% stall-free, TTFA p95 270-290 ms; no ERROR line; the llm's GPU tests all pass.
set -uo pipefail
OUT=${OUT:-/tmp/out}
env OUT="$OUT/defaults" ONLY=a RATES=30 LEVELS=256 BURST=0 timeout "${ARM_SECONDS:-380}" \
  bash bench/overload.sh 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -3
cat "$OUT/defaults/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
grep -m1 'admission by' "$OUT/defaults/up.log"
grep -m1 'admission: at most' "$OUT/defaults/up.log"
grep -E 'holds [0-9]+ streams|takes [0-9.]+ GiB|cannot start' "$OUT/defaults/up.log" | head -5
echo "  run eagerly: $(grep -c 'run eagerly' "$OUT/defaults/up.log" 2> /dev/null);" \
  "ERROR or CRITICAL lines: $(grep -cE ' (ERROR|CRITICAL) ' "$OUT/defaults/up.log" 2> /dev/null)"
(cd "$OUT" && tar czf call1.tgz defaults && rm -rf defaults)
OUT="$OUT" timeout 200 bash bench/gpu_smoke.sh tests-llm 2>&1 | tail -4
