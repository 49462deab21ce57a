#!/bin/bash
# Call 1: where the llm's decode step goes under MPS at 25% (the stack's share) and uncapped, by kernel;
# what a mixed step (a new request's last 16 positions joining) costs against the decode steps around it.
set -x
SITE=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 - <<'PY' 2>&1 | tee $OUT/call1_profile.log
import os, subprocess, sys
from services.mps import MpsDaemon
with MpsDaemon() as mps:
    for share in (25, 100):
        env = {**os.environ, **mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share)}
        print(f"#### MPS share {share}%", flush=True)
        subprocess.run([sys.executable, "bench/llm_step_profile.py", "--batches", "1,16,32", "--context", "256",
                        "--kv-cache-gb", "8", "--join", "16", "--top", "30",
                        "--json", f"{os.environ['OUT']}/call1_profile_{share}.json"], env=env, check=False)
PY
