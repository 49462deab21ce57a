# Sourced by the scripts run on a lent GPU machine (bench/gpu_smoke.sh and the calls in docs/results/): OUT (default
# /tmp/out) made, the wheels of .whl/ installed into a temporary directory for this run only (SITE, removed at exit),
# PYTHONPATH set to them and the tree, and the GPU written to $OUT/gpu.txt. (bench/stack.sh keeps its own: its exit
# trap also stops the stack.)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH=$SITE:$PWD:$PWD/protos PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
