#!/usr/bin/env bash
# Call 4 (H100): the four CUDA tests call 3 failed, after their fix; then the stack at Poisson 30/s (defaults: PDL on).
set -uo pipefail
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
echo "== GPU tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_codec_history.py tests/test_codec_prefix.py tests/test_codec_solve.py \
  tests/test_solve_worker.py 2>&1 | tee $OUT/gpu_tests.log | tail -3
echo "== the stack at Poisson 30"
OUT=$OUT/stack ONLY=a RATES=30 LEVELS="" BURST=0 timeout 380 bash bench/overload.sh > $OUT/stack.log 2>&1
tail -4 $OUT/stack.log; cat $OUT/stack/overload.txt 2>/dev/null
