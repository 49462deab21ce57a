#!/usr/bin/env bash
# The wheels a lent GPU machine lacks (docs/benchmarks.md; the device's image has Python 3.12, torch, transformers,
# onnxruntime and prometheus-client), downloaded here into .whl/ for bench/gpu_smoke.sh and bench/stack.sh to install
# there (carry .whl with the call). Run it on a fresh checkout before the first GPU call:
#   bash bench/wheels.sh            # the stack's and the GPU tests' wheels
#   bash bench/wheels.sh --parity   # and the codec parity tests' CPU oracle (cosyvoice2-eu, conformer) and what its
#                                   # modules import beyond the image: einops, diffusers (without them the parity
#                                   # tests failed on the device, 2026-11-27); tests/codec_reference.py stands in
#                                   # for omegaconf. .whl is then ~32 MB: with the tree (kept under 30 MiB by
#                                   # tests/test_house.py) that is near what a device call carries (64 MiB); move
#                                   # py-spy's wheel out for such a call
# Beyond the services' own imports: cffi and pycparser, because soundfile's wheel (librosa's) imports cffi, which the
# image lacks, and transformers then fails to import any model beside it (the llm bench's peer, 2026-11-27);
# py-spy, to sample the services' stacks during a load.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=(grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 'protobuf>=7,<8' googleapis-common-protos
        bigvgan==2.4.1 librosa audioread soundfile soxr pooch decorator platformdirs cffi pycparser
        silero-vad kaldi-native-fbank lameenc py-spy)
if [ "${1:-}" = --parity ]; then
  wheels+=(cosyvoice2-eu==0.2.8 conformer==0.3.2 einops diffusers importlib-metadata zipp)
fi
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d .whl "${wheels[@]}"
du -sh .whl
