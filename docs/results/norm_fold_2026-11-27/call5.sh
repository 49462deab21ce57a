#!/usr/bin/env bash
# Call 5 (H100): the GPU test files calls 3 and 4 left between them (from the codec parity tests to the codec stream).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 1
PYTHONPATH=$SITE:$PWD:$PWD/protos timeout 400 python3 -m pytest -q -p no:cacheprovider -rs tests/test_codec_parity.py \
  tests/test_codec_prefix.py tests/test_codec_stream.py 2>&1 | tee "$OUT/call5_gpu_tests.log" | tail -6
