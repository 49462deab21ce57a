#!/usr/bin/env bash
# Call 2 (H100): the codec parity tests' errors of call 1 read; the folded norms again after reading whole frames at
# once, the column sums made once and the last product adding in place: flow calls alone and beside the llm.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH=$SITE:$PWD:$PWD/protos PYTHONUNBUFFERED=1
echo "== parity"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_codec_parity.py --tb=short -rfE 2>&1 > "$OUT/call2_parity.log"
grep -E "^E  |Error|passed|failed" "$OUT/call2_parity.log" | head -14
echo "== norm_linear tests"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_norm_linear.py --tb=line 2>&1 | tail -3
echo "== flow calls alone"
timeout 170 python3 bench/codec_flow_profile.py --streams 1,6,12 --variants norms-apart,defaults,norms-apart \
  --json "$OUT/call2_flow_profile.json" > "$OUT/call2_flow_profile.log" 2>&1
tail -12 "$OUT/call2_flow_profile.log"
echo "== beside the llm"
for v in defaults norms-apart; do
  timeout 95 python3 bench/gpu_sharing.py --seconds 3 --batch 32 --windows 6 --mps-llm-threads 25 --no-one-process \
    --flow-variant $v --json "$OUT/call2_sharing_$v.json" > "$OUT/call2_sharing_$v.log" 2>&1
  echo "-- $v"; grep "mps, llm at 25%" "$OUT/call2_sharing_$v.log"
done
