#!/usr/bin/env bash
# Call 2 (H100): the vocoder's steady calls of 6 windows beside the llm (B 32, MPS at 25%) by flow variant.
set -uo pipefail
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1
for v in no-pdl triton-products defaults no-pdl; do
  echo "== beside the llm: $v"
  start=$(date +%s)
  timeout 170 python3 bench/gpu_sharing.py --seconds 3 --batch 32 --windows 6 --mps-llm-threads 25 --no-one-process \
    --flow-variant $v --json $OUT/sharing_${v}_$start.json > $OUT/sharing_${v}_$start.log 2>&1; tail -2 $OUT/sharing_${v}_$start.log
  echo "($(( $(date +%s) - start )) s)"
done
