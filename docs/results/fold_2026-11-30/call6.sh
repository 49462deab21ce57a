#!/usr/bin/env bash
# Written 2026-11-30 ~21:15 UTC, before any run (the device time of 2026-11-30 was spent on calls 1-5): time to first
# audio at one stream from a client, the folds on (the default) and off (prefetch_linear.FOLD = False: the products
# as prefetch-2026-11-30 kept them, the per-frame kernels between), every graph captured before serving.
#   bash docs/results/fold_2026-11-30/call6.sh
#
# Predicted: TTFA p50 on 83-85 ms, off 86-89 ms (prefetch-2026-11-30: 86.5); the vocoder_first_chunk stage 2-4 ms
# shorter on (a first call alone 16.9-19.3 ms against 20.8-21.0 in call 2); p95 within 10 ms of p50 in both.
set -uo pipefail
source bench/stack.sh
for arm in on off; do
  if [ "$arm" = off ]; then
    sed -i 's/^FOLD = True /FOLD = False/' services/vocoder/codec/prefetch_linear.py
  fi
  grep -m1 "^FOLD" services/vocoder/codec/prefetch_linear.py
  if start_stack --kv-cache-gb 32 --max-num-seqs 256 --graphs-before-serving all; then
    timeout 100 python3 -c "$SERVE_PY" bench --reply-seconds 2-4 --no-progress --timeout 60 --concurrency 1 \
      --requests 12 --warmup 2 --out "$WORK/one_$arm" 2>&1 | tail -1
    cp "$WORK/one_$arm/bench.md" "$OUT/call6_$arm.md"; cp "$WORK/one_$arm/bench.json" "$OUT/call6_$arm.json"
    sed -n '/Mean stage/,/slowest/p' "$OUT/call6_$arm.md"
    stop_stack
  fi
  gzip -c "$OUT/up.log" > "$OUT/call6_up_$arm.log.gz"; rm -f "$OUT/up.log"
done
sed -i 's/^FOLD = False/FOLD = True /' services/vocoder/codec/prefetch_linear.py
