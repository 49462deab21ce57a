#!/usr/bin/env bash
# Run 2026-11-30 ~14:54 UTC (written 2026-11-30 14:52 UTC): call 3 again, done right. Call 3 ran its bench while the
# vocoder still captured 190 of its graphs (`--graphs-before-serving covers`: calls of shapes not captured yet padded
# into the largest), so a first chunk waited behind captures (TTFA p50 142 ms, p90 1.08 s, off); its `on` files did
# not come back (over 8 files), and its tests ran out of time after 60 of 77 (two failed: bf16 plain products
# compared by mean error with PyTorch's, where both round once; that check is now for the GELU only). Here every graph
# is captured before serving, replies are 2-4 s (time to first audio at one stream does not depend on them), and the
# kernel's tests run last.
#   bash docs/results/prefetch_2026-11-30/call4.sh
#
# Predicted (written 2026-11-30 14:52 UTC, before the run): TTFA p50 at one stream 86-92 ms off (2026-11-29: 88.6 ms),
# 80-86 ms on (a stream's first flow call -5.6 to -5.9 ms alone in call 2); the vocoder's first chunk (its
# vocoder_first_chunk stage) ~5 ms shorter on; the tests pass.
set -uo pipefail
source bench/stack.sh
for arm in on off; do
  if [ "$arm" = off ]; then
    sed -i 's/^ENABLED = True /ENABLED = False/' services/vocoder/codec/prefetch_linear.py
  fi
  grep -m1 "^ENABLED" services/vocoder/codec/prefetch_linear.py
  if start_stack --kv-cache-gb 32 --max-num-seqs 256 --graphs-before-serving all; then
    timeout 100 python3 -c "$SERVE_PY" bench --reply-seconds 2-4 --no-progress --timeout 60 --concurrency 1 \
      --requests 10 --warmup 2 --out "$WORK/one_$arm" 2>&1 | tail -1
    cp "$WORK/one_$arm/bench.md" "$OUT/call4_$arm.md"; cp "$WORK/one_$arm/bench.json" "$OUT/call4_$arm.json"
    sed -n '/Mean stage/,/slowest/p' "$OUT/call4_$arm.md"
    stop_stack
  fi
  gzip -c "$OUT/up.log" > "$OUT/call4_up_$arm.log.gz"; rm -f "$OUT/up.log"
done
sed -i 's/^ENABLED = False/ENABLED = True /' services/vocoder/codec/prefetch_linear.py
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_prefetch_linear.py -k "flow_call or 80-256-256 or view" 2>&1 | tail -3
