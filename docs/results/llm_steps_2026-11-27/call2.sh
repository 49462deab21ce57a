#!/bin/bash
# Call 2: the decode attention in slices by context (this tree) against fixed slices (old_tree: 5fd7668).
# GPU tests of the llm's kernels and engine; each tree's step profile under MPS at 25%; each tree's llm beside
# the vocoder (bench/gpu_sharing.py, B 32, W 6, the llm at 25%).
SITE=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ROOT=$PWD
ln -sfn $ROOT/.whl old_tree/.whl
use() { cd $ROOT/$1; export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH; }
use .
python3 -m pytest -q tests/test_paged_attention.py tests/test_kernel_runner.py tests/test_engine.py 2>&1 | tail -3 | tee $OUT/call2_gpu_tests.log
for tree in old_tree . ; do
  use $tree; name=$([ $tree = . ] && echo new || echo old)
  python3 - <<PY 2>&1 | grep -v "^Warning\|_warn_once\|UserWarning" | tee $OUT/call2_profile_$name.log
import os, subprocess, sys
from services.mps import MpsDaemon
with MpsDaemon() as mps:
    env = {**os.environ, **mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    subprocess.run([sys.executable, "bench/llm_step_profile.py", "--batches", "1,16,32", "--context", "384",
                    "--kv-cache-gb", "8", "--join", "16", "--top", "12",
                    "--json", "$OUT/call2_profile_$name.json"], env=env, check=False)
PY
done
for tree in old_tree . old_tree . ; do
  use $tree; name=$([ $tree = . ] && echo new || echo old)
  python3 bench/gpu_sharing.py --seconds 3 --batch 32 --windows 6 --mps-llm-threads 25 --no-one-process \
    --json $OUT/call2_sharing_${name}_$(date +%s).json 2>&1 | tail -6 | tee -a $OUT/call2_sharing.log
done
cd $ROOT
for f in $OUT/call2_profile_*.log; do echo "== $f"; grep -E "^== batch|joining|_decode" $f; done
