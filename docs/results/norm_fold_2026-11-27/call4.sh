#!/usr/bin/env bash
# Call 4 (H100): the GPU tests call 3 did not reach in its 400 s (from the codec's history on), then the llm's floor
# and its peer side by side (bench/gpu_smoke.sh bench).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 1
echo "== the rest of the GPU tests"
PYTHONPATH=$SITE:$PWD:$PWD/protos timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_codec_history.py \
  tests/test_codec_solve.py tests/test_solve_worker.py tests/test_hift_snake.py tests/test_encoder_attention.py \
  tests/test_encoder_model.py tests/test_encoder_graphs.py tests/test_encoder_stream.py tests/test_encoder_worker.py \
  2>&1 | tee "$OUT/call4_gpu_tests.log" | tail -4
OUT=$OUT timeout 340 bash bench/gpu_smoke.sh bench 2>&1 | tail -30
cp "$OUT/llm_engine.log" "$OUT/call4_llm_engine.log" 2>/dev/null
