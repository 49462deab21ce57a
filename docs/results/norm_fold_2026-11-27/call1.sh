#!/usr/bin/env bash
# Call 1 (H100): the codec's GPU tests with the folded norms, then whole flow calls by variant alone
# (codec_flow_profile) and beside the llm under MPS at 25% (gpu_sharing), the two variants in turn.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH=$SITE:$PWD:$PWD/protos PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== codec GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_norm_linear.py tests/test_frame_ops.py tests/test_fused_linear.py \
  tests/test_codec_parity.py tests/test_codec_history.py tests/test_codec_prefix.py tests/test_codec_stream.py \
  tests/test_chunk_attention.py 2>&1 | tee "$OUT/call1_gpu_tests.log" | tail -6
echo "== flow calls alone"
timeout 170 python3 bench/codec_flow_profile.py --streams 1,6,12 --variants norms-apart,defaults,norms-apart \
  --json "$OUT/call1_flow_profile.json" > "$OUT/call1_flow_profile.log" 2>&1
tail -14 "$OUT/call1_flow_profile.log"
echo "== beside the llm"
for v in norms-apart defaults; do
  timeout 95 python3 bench/gpu_sharing.py --seconds 3 --batch 32 --windows 6 --mps-llm-threads 25 --no-one-process \
    --flow-variant $v --json "$OUT/call1_sharing_${v}_$SECONDS.json" > "$OUT/call1_sharing_${v}_$SECONDS.log" 2>&1
  echo "-- $v"; tail -6 "$(ls -t $OUT/call1_sharing_${v}_*.log | head -1)"
done
