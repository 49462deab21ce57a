#!/bin/bash
# Call 1: the mixed step (a turn's prefill riding with the decode rows) on this tree against old_tree (c0e7284):
# the text branch left out of packed steps that sample no text, the prefill attention's grid and search over
# min(S, N) sequences with 16-row tiles for small packed calls, a 48-row packed bucket.
# GPU tests of what changed; each tree's step profile with joins under MPS at 25% (old services, this bench);
# this tree without the 48/96 buckets; the packed attention by tile. ("new" had packed buckets of 48 and 96 rows,
# not kept: "new_no48" is the tree as committed. The old tree's log did not come back: call1_profile_old_summary.txt.)
SITE=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ROOT=$PWD
R=$OUT
export PYTHONPATH=$SITE:$ROOT:$ROOT/protos:$ROOT/bench PATH=$SITE/bin:$PATH
python3 -m pytest -q tests/test_paged_attention.py tests/test_text_skip.py tests/test_kernel_runner.py tests/test_engine.py \
  2>&1 | tail -3 | tee $R/call1_gpu_tests.log
profile() {  # name, services root, extra args
  PYTHONPATH=$SITE:$2:$2/protos:$ROOT/bench python3 - "$1" "${@:3}" <<PY 2>&1 | grep -v "^Warning\|_warn_once\|UserWarning" | tee $R/call1_profile_$1.log
import os, subprocess, sys
from services.mps import MpsDaemon
with MpsDaemon() as mps:
    env = {**os.environ, **mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    subprocess.run([sys.executable, "$ROOT/bench/llm_step_profile.py", "--batches", "16,22,32", "--context", "384",
                    "--kv-cache-gb", "8", "--join", "13", "--top", "14", "--steps", "12",
                    "--json", "$R/call1_profile_" + sys.argv[1] + ".json", *sys.argv[2:]], env=env, check=False)
PY
}
profile old $ROOT/old_tree
profile new $ROOT
profile new_no48 $ROOT --packed-buckets 16,32,64,128,192,256,384,512,768,1024
python3 - <<PY 2>&1 | grep -v "^Warning\|_warn_once\|UserWarning" | tee $R/call1_attention.log
import os, subprocess, sys
from services.mps import MpsDaemon
with MpsDaemon() as mps:
    for pct in ("25", "100"):
        env = {**os.environ, **mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": pct}
        subprocess.run([sys.executable, "bench/llm_attention.py", "--packed", "13", "--batches", "16,22,32",
                        "--contexts", "256,512", "--json", f"$R/call1_attention_{pct}.json"], env=env, check=False)
PY
echo "==== summary"
cat $R/call1_gpu_tests.log
for f in $R/call1_profile_*.log; do echo "== $f"; grep -E "^== batch|joining|kernels: mixed" $f; done
