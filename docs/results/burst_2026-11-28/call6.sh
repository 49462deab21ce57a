#!/usr/bin/env bash
# Sessions started in a burst keep their places (services/gateway/headroom.py: while a burst drains, an ongoing
# session's next turn may run up to --admit-burst-turns): 128 two-turn sessions at the same instant, each second turn
# 0.5 s after its reply has played out (as calls 4 and 5, where 15 of the 128 second turns were refused both times),
# twice, on one stack at its defaults, replies of 2-20 s.
#   bash docs/results/burst_2026-11-28/call6.sh
#
# Predicted (written 2026-11-28 14:58 UTC, before the call; an H200): each run 128 first turns and 128 second turns
# admitted, none refused; first turns 93-100% stall-free (as before: the change lets in only second turns, from ~3.5 s
# on, after the burst's starts), second turns 99-100% stall-free with TTFA p95 230-300 ms (15 more of them run while
# the burst's turns still run over the limit).
set -uo pipefail
source bench/stack.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
common=(--target 127.0.0.1:50051 --reply-seconds 2-20 --no-progress --timeout 180 --warmup 0 --concurrency 128
        --requests 128 --turns 2 --turn-gap 0.5)
if start_stack --kv-cache-gb 32 --max-num-seqs 256; then
  for run in 1 2; do
    serve bench "${common[@]}" --seed $run --out "$OUT/sessions_$run" > "$OUT/sessions_$run.txt" 2>&1
    grep -A3 "turn  turns" "$OUT/sessions_$run.txt"; grep -A1 "refused  refusal" "$OUT/sessions_$run.txt"
  done
  scrape 9091 "$OUT/metrics_gateway.txt"
  grep -E "^gateway_(burst_admissions_total|headroom_refusals_total|admission_limit) " "$OUT/metrics_gateway.txt" | paste -sd' '
fi
stop_stack
(cd "$OUT" && tar czf "$WORK/call6.tgz" . && find . -mindepth 1 -delete && mv "$WORK/call6.tgz" .)
# Call 6 (H200, 190 s; call6.tgz): both runs 128 first turns and 128 second turns admitted, none refused; first turns
# 100% and 100% stall-free (TTFA p95 2374 and 2342 ms); second turns 100% and 100% (p95 241 and 287 ms). Over the two
# runs 185 turns were let in over the limit (80 first turns each, the rest second turns while the bursts drained). In
# range.
