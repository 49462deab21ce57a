#!/bin/bash
# Call 5: the llm beside the vocoder with its kernels' PDL on and off, in turn (call 4 ran out of time after one).
SITE=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH
for pdl in on off on off; do
  python3 bench/gpu_sharing.py --seconds 3 --batch 32 --windows 6 --mps-llm-threads 25 --no-one-process --llm-pdl $pdl \
    --json $OUT/call5_sharing_pdl_${pdl}_$(date +%s).json 2>&1 | grep "mps, llm" | sed "s/^/PDL $pdl /" | tee -a $OUT/call5_sharing.log
done
