#!/usr/bin/env bash
# Call 1 (H100): the codec's GPU tests with programmatic dependent launch, whole flow calls by variant, and the
# (call 2: the vocoder's steady calls beside the llm by variant)
set -uo pipefail
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== GPU tests (codec)"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_fused_linear.py tests/test_frame_ops.py tests/test_chunk_attention.py \
  tests/test_codec_parity.py tests/test_codec_stream.py tests/test_codec_history.py tests/test_codec_solve.py \
  tests/test_solve_worker.py 2>&1 | tee $OUT/gpu_tests.log | tail -6
echo "== flow calls by variant"
timeout 200 python3 bench/codec_flow_profile.py --streams 1,6,12 --variants no-pdl,defaults,triton-products,no-pdl-triton-products,no-pdl \
  --json $OUT/flow_profile.json > $OUT/flow_profile.log 2>&1; tail -22 $OUT/flow_profile.log
