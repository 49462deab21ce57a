#!/usr/bin/env bash
# The issue's other stack targets on this tree, at the defaults (`moss-serve up --device cuda --preset moss-speech
# --kv-cache-gb 32 --max-num-seqs 256`), one stack, replies of 2-20 s: one stream at a time (TTFA p50, 12 requests),
# Poisson 40 a second for 20 s, and 128 started at the same instant (twice). Everything in $OUT/call3.tgz.
#   bash docs/results/peer_2026-11-29/call3.sh
#
# Predicted (written 2026-11-29 12:45 UTC, before the call; an H200): one stream TTFA p50 88-98 ms (the issue: 92 ms);
# Poisson 40: 45-60% admitted (the Poisson 60: 49%; Poisson 30 today: 70%), every admitted stream stall-free;
# 128 at once: 128 admitted, 90-100% stall-free, TTFA p95 2-2.5 s.
set -uo pipefail
source bench/stack.sh
common=(--reply-seconds 2-20 --no-progress --timeout 180)
if start_stack --kv-cache-gb 32 --max-num-seqs 256; then
  serve bench "${common[@]}" --concurrency 1 --requests 12 --warmup 2 --out "$OUT/c3/one" 2>&1 | tail -4
  serve bench "${common[@]}" --rate 40 --seconds 20 --warmup 4 --out "$OUT/c3/poisson_40" 2>&1 | tail -4
  for k in 1 2; do
    sleep 20
    serve bench "${common[@]}" --concurrency 128 --requests 128 --warmup 0 --out "$OUT/c3/burst_128_$k" 2>&1 | tail -4
  done
  stop_stack
fi
cp "$OUT/up.log" "$OUT/c3/" 2> /dev/null
(cd "$OUT" && tar czf call3.tgz c3 && rm -rf c3)
