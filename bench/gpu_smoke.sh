#!/usr/bin/env bash
# One call on a lent GPU machine (see docs/benchmarks.md): the test suite on that image, the demo
# with llm and vocoder on CUDA, then the llm engine benchmark with the real-size model.
# Expects missing wheels in .whl/ (grpcio 1.85.1, protobuf 7, bigvgan, librosa and its needs).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/protos PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, grpc, google.protobuf as pb; print('torch', torch.__version__, 'grpc', grpc.__version__, 'protobuf', pb.__version__)"
echo "== tests"; python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tail -4
echo "== demo on cuda"; python3 -m services.demo --device cuda --out "$OUT/demo_cuda.wav" 2>&1 | tail -12
echo "== llm engine"; python3 bench/llm_engine.py --preset moss-speech --device cuda --kv-cache-gb 8 --json "$OUT/llm_engine.json" 2>&1 | tail -8
