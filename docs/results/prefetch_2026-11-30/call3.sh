#!/usr/bin/env bash
# Run 2026-11-30 ~14:42 UTC (written 2026-11-30 14:40 UTC): the products with their weights read before the launch
# wait, now the default up to 160 frames (codec/prefetch_linear.py), on a GPU: the kernel's tests with a whole flow
# call against cuBLAS's, then time to first audio at one stream from a client on the real-size stack (`moss-serve up
# --device cuda --preset moss-speech --kv-cache-gb 32 --max-num-seqs 256`), with the kernel (on), without it (off:
# ENABLED = False in this copy of the tree) and with it again. Everything in $OUT/call3.tgz.
#   bash docs/results/prefetch_2026-11-30/call3.sh
#
# Predicted (written 2026-11-30 14:40 UTC, before the run): the tests pass, the flow call through the kernel ≥ 40 dB
# against cuBLAS's (call 2: 54.5-55.4 dB); TTFA p50 at one stream 88-92 ms off (2026-11-29: 88.6 ms), 82-86 ms on
# (a stream's first flow call -5.6 to -5.9 ms alone in call 2, and the vocoder's part of first audio is its first call).
set -uo pipefail
source bench/stack.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_prefetch_linear.py 2>&1 | tail -3
common=(--reply-seconds 2-20 --no-progress --timeout 180)
mkdir -p "$OUT/c3"
for arm in on off on2; do
  if [ "$arm" = off ]; then
    sed -i 's/^ENABLED = True /ENABLED = False/' services/vocoder/codec/prefetch_linear.py
  else
    sed -i 's/^ENABLED = False/ENABLED = True /' services/vocoder/codec/prefetch_linear.py
  fi
  grep -m1 "^ENABLED" services/vocoder/codec/prefetch_linear.py
  if start_stack --kv-cache-gb 32 --max-num-seqs 256; then
    timeout 130 python3 -c "$SERVE_PY" bench "${common[@]}" --concurrency 1 --requests 12 --warmup 2 \
      --out "$OUT/c3/one_$arm" 2>&1 | tail -3
    stop_stack
  fi
  cp "$OUT/up.log" "$OUT/c3/up_$arm.log" 2> /dev/null
done
(cd "$OUT" && tar czf call3.tgz c3 && rm -rf c3)
