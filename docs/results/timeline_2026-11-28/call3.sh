#!/usr/bin/env bash
# 128 streams started at the same instant (the issue's third target: >= 99% stall-free), on the head, issue 23: the
# stack at its defaults (headroom admission from its initial limit of 48 turns) and the same stack with the rule's
# initial limit at 128 (--admit-initial-turns 128), each a stack of its own on one machine, one gateway, replies of
# 2-20 s. Everything each arm leaves ends up in $OUT/call3.tgz (a device call brings back only a few files).
#   [ARMS="defaults i128"] bash docs/results/timeline_2026-11-28/call3.sh
#
# The question: does the defaults' stack serve a burst of 128 stall-free if the rule lets it in (the start limit
# starts its turns 16 at a time), or is 48 at the start what it can carry?
#
# Predicted (written 2026-11-28 11:00 UTC, before the call, an H200):
# - defaults: 40-60 of 128 admitted (the limit starts at 48 and a burst brings no signal before the rest are refused),
#   100% stall-free, TTFA p95 at the client 300-500 ms.
# - i128: 110-128 admitted, 97-100% stall-free, TTFA p50 0.6-0.8 s and p95 1.0-1.5 s (the last of 128 prefills and
#   first chunks, 16 at a time).
set -uo pipefail
OUT=${OUT:-/tmp/out}
for arm in ${ARMS:-defaults i128}; do
  case $arm in defaults) flags=() ;; i128) flags=(--admit-initial-turns 128) ;; *) echo "unknown arm $arm"; exit 2 ;; esac
  echo "=== arm $arm: moss-serve up ${flags[*]}"
  OUT=$OUT/$arm ONLY=a RATES= LEVELS= BURST=128 timeout "${ARM_SECONDS:-280}" bash bench/overload.sh "${flags[@]}" 2>&1 \
    | grep -vE "^\s*$|it/s|%\|" | tail -1
  cat "$OUT/$arm/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
  echo "  captured while serving: $(grep -c "captured while serving" "$OUT/$arm/up.log" 2> /dev/null)"
done
(cd "$OUT" && tar czf call3.tgz ${ARMS:-defaults i128} && rm -rf ${ARMS:-defaults i128})
# Call 3 (H200): neither arm started: the encoder could not import silero_vad, whose wheel had been left out of .whl
# to make room (moss-serve up stops when a service exits before serving). 560 s of device time lost.
# Call 4 (written before it, 412 s of device time left): ARMS=i128 alone, prediction as above.
