#!/usr/bin/env bash
# The codec's flow against the reference twice: as MOSS-Speech runs it (float32, eager, a stream at a time) and as a
# serving stack would (tests/codec_reference.py's ServedReference: bf16, calls of 16 streams in one batch, each call
# replayed from a CUDA graph). Carry .whl with `bench/wheels.sh --parity`'s wheels (silero-vad and py-spy left out).
#   bash docs/results/peer_2026-11-29/call1.sh
#
# Predicted (written 2026-11-29 12:40 UTC, before the call; an H200). The served reference runs the reference's own
# modules: LayerNorm, GELU, attention through SDPA with a bias mask, each as its own kernels, ~1,000-1,500 kernels an
# Euler step over every frame of prompt + window (160 frames a row, where ours solves the ones after the prompt's
# prefix). Replayed from a graph a kernel costs ~2-3 us, so a first chunk (1 stream) takes ~30-50 ms against ours
# ~22 ms (ours 1.3-2.3x faster), and the steady aggregate at 64 streams, calls of 16 (32 estimator rows x 160 frames),
# is bound by its products: 70-100x real time against ours ~110x (ours 1.0-1.6x). The served reference in bf16
# against itself in float32: 35-45 dB (ours as served: 42 dB).
set -uo pipefail
OUT=${OUT:-/tmp/out}
source bench/wheel_site.sh > /dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
echo "== the peer's batching against its own steps"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_codec_peer.py 2>&1 | tail -3
echo "== bench/codec.py"
timeout 480 python3 bench/codec.py --device cuda --streams 8,32,64 --reps 5 --json "$OUT/codec_peer.json" 2>&1 \
  | grep -v -i "warn\|deprecat" | tee "$OUT/codec_peer.log" | tail -22
