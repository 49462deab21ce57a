#!/usr/bin/env bash
# Written 2026-11-30 ~20:55 UTC after call4: test_megakernel's fixture turns the megakernel on (on a GPU the estimator
# folded its blocks, so no run went through the kernel), and the products at K 1,024 with tiles() halving float32's
# channels; then the solve through the folded kernel on a GPU.
source bench/wheel_site.sh
for spec in "test_megakernel:100:" "test_prefetch_linear:100:1024 or slice" "test_codec_solve:150:"; do
  IFS=: read -r f t k <<< "$spec"
  echo "== $f ${k:+-k '$k'} (timeout $t s)"
  timeout $t python3 -m pytest -q -x -p no:cacheprovider --durations=3 ${k:+-k "$k"} tests/$f.py > "$OUT/$f.log" 2>&1; echo "rc $?"
  grep -E "^E |FAILED|passed|failed|^[0-9.]+s (call|setup)" "$OUT/$f.log" | grep -v Warn | tail -8
done
