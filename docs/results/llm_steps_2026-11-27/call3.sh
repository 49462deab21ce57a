#!/bin/bash
# Call 3: the decode attention against its floor, by variant (slices, key tile, warps, stages), as an MPS client at
# the stack's 25% and uncapped.
SITE=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --target $SITE .whl/*.whl
export PYTHONPATH=$SITE:$PWD:$PWD/protos:$PWD/bench PATH=$SITE/bin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 - <<'PY' 2>&1 | tee $OUT/call3_attention.log
import os, subprocess, sys
from services.mps import MpsDaemon
with MpsDaemon() as mps:
    for share in (25, 100):
        env = {**os.environ, **mps.env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share)}
        print(f"#### MPS share {share}%", flush=True)
        subprocess.run([sys.executable, "bench/llm_attention.py", "--batches", "1,8,16,32,64", "--contexts", "256,512,1024",
                        "--json", f"{os.environ['OUT']}/call3_attention_{share}.json"], env=env, check=False)
PY
