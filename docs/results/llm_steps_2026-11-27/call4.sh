#!/bin/bash
# Call 4: the GPU tests (bench/gpu_smoke.sh's list: the llm's kernels with their PDL and the new decode attention,
# the codec's with launch.py moved), then the llm beside the vocoder with its kernels' PDL on and off, in turn.
OUT=$OUT bash bench/gpu_smoke.sh tests 2>&1 | tail -8
SITE=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH
for pdl in off on off on; do
  python3 bench/gpu_sharing.py --seconds 3 --batch 32 --windows 6 --mps-llm-threads 25 --no-one-process --llm-pdl $pdl \
    --json $OUT/call4_sharing_pdl_${pdl}_$(date +%s).json 2>&1 | grep "mps, llm" | sed "s/^/PDL $pdl /" | tee -a $OUT/call4_sharing.log
done
