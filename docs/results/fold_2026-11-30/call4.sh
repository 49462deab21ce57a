#!/usr/bin/env bash
source bench/wheel_site.sh
# Written 2026-11-30 ~20:45 UTC after call1 found float32 at K 1,024 over shared memory (tiles() now halves the
# channels): the GPU tests of the change, file by file with a timeout each and their logs in $OUT.
for spec in test_prefetch_linear:110 test_frame_ops:60 test_codec_parity:90 test_megakernel:150; do
  f=${spec%%:*}; t=${spec##*:}
  echo "== $f (timeout $t s)"
  timeout $t python3 -m pytest -q -x -p no:cacheprovider --durations=4 tests/$f.py > "$OUT/$f.log" 2>&1; echo "rc $?"
  grep -E "^E |FAILED|passed|failed|^[0-9.]+s (call|setup)" "$OUT/$f.log" | grep -v Warn | tail -8
done
