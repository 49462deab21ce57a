#!/usr/bin/env bash
# One arm of the stack with the llm's share following the load (ARM=on, the default) or fixed (ARM=off:
# --no-mps-llm-follows-load, the MPS cap of 25% on every step as before), every graph captured before serving:
# time to first audio at one stream (12 turns of 2-4 s), then 256 streams started over 6 s (replies of 2-20 s). The
# llm's steps by place from its metrics after each load. Results in $OUT/call<N>_<arm>.{md,json}, the up log gzipped.
# REQUESTS (default 12) one-stream turns (0: none); RAMP=0 leaves the ramp out; LOADS: more loads after them, each
# "poisson" (30 a second for 20 s) or "burst" (128 at the same instant).
#   ARM=on N=3 bash docs/results/llm_share_2026-12-01/arm.sh
set -uo pipefail
source bench/stack.sh
arm=${ARM:-on}; n=${N:-3}
flags=(--kv-cache-gb 32 --max-num-seqs 256 --graphs-before-serving all)
[ "$arm" = off ] && flags+=(--no-mps-llm-follows-load)
if start_stack "${flags[@]}"; then
  grep -E "steps take the whole GPU|keep [0-9]+% of the GPU|llm: its steps" "$OUT/up.log" | head -3 | cut -c1-250
  for load in ${LOADS:-}; do
    case $load in
      poisson) timeout 150 python3 -c "$SERVE_PY" bench --reply-seconds 2-20 --no-progress --timeout 180 --rate 30 \
                 --seconds 20 --warmup 4 --out "$WORK/$load" 2>&1 | tail -1 ;;
      burst) timeout 150 python3 -c "$SERVE_PY" bench --reply-seconds 2-20 --no-progress --timeout 180 \
               --concurrency 128 --requests 128 --warmup 0 --out "$WORK/$load" 2>&1 | tail -1 ;;
    esac
    cp "$WORK/$load/bench.md" "$OUT/call${n}_${arm}_$load.md"; sed -n 5,7p "$OUT/call${n}_${arm}_$load.md"
    scrape 9092 "$WORK/llm_$load.txt"; grep "^llm_gpu_place_steps_total" "$WORK/llm_$load.txt"
  done
  [ "${REQUESTS:-12}" = 0 ] && { stop_stack; gzip -c "$OUT/up.log" > "$OUT/call${n}_up_${arm}.log.gz"; rm -f "$OUT/up.log"; exit 0; }
  timeout 100 python3 -c "$SERVE_PY" bench --reply-seconds 2-4 --no-progress --timeout 60 --concurrency 1 \
    --requests "${REQUESTS:-12}" --warmup 2 --out "$WORK/one" 2>&1 | tail -1
  cp "$WORK/one/bench.md" "$OUT/call${n}_${arm}_one.md"
  sed -n '/Mean stage/,/slowest/p' "$OUT/call${n}_${arm}_one.md" | head -12
  scrape 9092 "$WORK/llm_one.txt"; grep "^llm_gpu_place_steps_total" "$WORK/llm_one.txt"
  [ "${RAMP:-1}" = 0 ] && { stop_stack; gzip -c "$OUT/up.log" > "$OUT/call${n}_up_${arm}.log.gz"; rm -f "$OUT/up.log"; exit 0; }
  timeout 150 python3 -c "$SERVE_PY" bench --reply-seconds 2-20 --no-progress --timeout 180 --concurrency 256 \
    --requests 256 --ramp 6 --warmup 0 --out "$WORK/ramp" 2>&1 | tail -1
  cp "$WORK/ramp/bench.md" "$OUT/call${n}_${arm}_ramp.md"
  scrape 9092 "$WORK/llm_ramp.txt"; grep "^llm_gpu_place_steps_total" "$WORK/llm_ramp.txt"
  stop_stack
fi
gzip -c "$OUT/up.log" > "$OUT/call${n}_up_${arm}.log.gz"; rm -f "$OUT/up.log"
