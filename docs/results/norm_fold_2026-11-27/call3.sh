#!/usr/bin/env bash
# Call 3 (H100): every GPU test on this tree (the folded norms taken out; the parity oracle's wheels carried this
# time), then the FP8 agreement tool once at the real size (random weights: it runs, in memory; its figures mean
# something only on a trained checkpoint).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
OUT=$OUT timeout 400 bash bench/gpu_smoke.sh tests 2>&1 | tail -8
cp "$OUT/gpu_tests.log" "$OUT/call3_gpu_tests.log" 2>/dev/null
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH=$SITE:$PWD:$PWD/protos PYTHONUNBUFFERED=1
echo "== fp8 agreement"
timeout 170 python3 bench/fp8_agreement.py --preset moss-speech --device cuda --max-new-tokens 100 \
  --json "$OUT/call3_fp8_agreement.json" > "$OUT/call3_fp8_agreement.log" 2>&1
echo "rc $?"; tail -20 "$OUT/call3_fp8_agreement.log"
