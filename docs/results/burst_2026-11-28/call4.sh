#!/usr/bin/env bash
# The burst rule again (issue 23's third target, a second run), and a burst of Converse sessions: 128 sessions of 2
# turns each started at the same instant on an idle stack, each next turn 0.5 s after its reply has played out at the
# client (bench --turns 2 --turn-gap 0.5). Their first turns come in as a burst, over the headroom limit; the question
# is whether their second turns find places (ongoing sessions' turns meet the limit plus a 10% reserve) or are
# refused while the burst's turns still run over it. One stack at its defaults, replies of 2-20 s.
#   bash docs/results/burst_2026-11-28/call4.sh
#
# Predicted (written 2026-11-28 15:27 UTC, before the call; an H200): the plain burst 128 of 128, 99-100% stall-free,
# TTFA p95 2.0-2.6 s at the client. The sessions: 128 first turns admitted; the second turns come spread over ~2-20 s
# (each after its reply has played), when the burst's turns have ended at the gateway (a turn's audio is sent ~5x
# faster than it plays): 0-5 of 128 refused, >= 99% stall-free, their TTFA p95 under 300 ms.
set -uo pipefail
source bench/stack.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
common=(--target 127.0.0.1:50051 --reply-seconds 2-20 --no-progress --timeout 180 --warmup 0)
if start_stack --kv-cache-gb 32 --max-num-seqs 256; then
  serve bench "${common[@]}" --concurrency 128 --requests 128 --out "$OUT/burst_128" 2>&1 | tail -12
  scrape 9091 "$OUT/metrics_after_burst.txt"
  serve bench "${common[@]}" --concurrency 128 --requests 128 --turns 2 --turn-gap 0.5 --out "$OUT/sessions_128x2" 2>&1 | tail -16
  scrape 9091 "$OUT/metrics_after_sessions.txt"
  for f in "$OUT"/metrics_after_*.txt; do
    echo "$(basename "$f"): $(grep -E "^gateway_(burst_admissions_total|headroom_refusals_total|admission_limit) " "$f" | paste -sd' ')"
  done
fi
stop_stack
(cd "$OUT" && tar czf "$WORK/call4.tgz" --exclude call4.tgz . && find . -mindepth 1 -delete && mv "$WORK/call4.tgz" .)
# Call 4 (H200, 187 s; call4.tgz; .whl without the parity wheels, the tree being over the carry limit with them): the
# plain burst 128 of 128, 100% stall-free, TTFA p50 / p95 1264 / 2428 ms. The sessions: 128 first turns admitted (80
# over the limit), 93.8% stall-free: 8 of the burst's later starters (first audio 1.23-1.36 s after sending) were
# 59-82 ms late on their second chunk at 1.64-1.79 s, before any second turn had been sent (the first at 3.45 s);
# 113 second turns ran, 100% stall-free, TTFA p50 / p95 164 / 234 ms; 15 were refused with a hint, sent 3.45-5.59 s
# in, while the burst's turns still ran over the limit and its 10% reserve for sessions. Out of range on both counts.
