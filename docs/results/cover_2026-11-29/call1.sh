#!/usr/bin/env bash
# The vocoder's covers (capture.py: each kind's largest graph captured before serving; a call whose own graph is not
# captured yet is padded into it instead of running eagerly) and the flow's encoder state (--flow-encoder-window, not
# measured on a GPU before). In order:
#   1. bench/gpu_smoke.sh tests-codec: every codec GPU test on this tree (the covers in the two lanes' capture test;
#      the encoder state's CUDA-graph cases in test_codec_history.py);
#   2. bench/codec_history.py: steady and first calls, per-block against encoder-state, with launch counts.
#   bash docs/results/cover_2026-11-29/call1.sh
#
# Predicted (written 2026-11-29 22:47 UTC, before the call): 1. every test passes. 2. the encoder state takes the
# conformer's work from ~320 positions a row to ~25-30: a steady call of 32 streams 63.7 -> 59-61 ms, of 16 streams
# 43.2 -> 40-42 ms (the encoder was 8-9% of them, conformer-2026-11-29); a first call unchanged (~22 ms: nothing kept
# yet); kernels an Euler step unchanged (the encoder runs once a call, before the steps).
source bench/wheel_site.sh
timeout 300 bash bench/gpu_smoke.sh tests-codec 2>&1 | tail -8
timeout 220 python3 bench/codec_history.py --streams 1,16,32 --modes history --variants per-block,encoder-state \
  --kernels --json "$OUT/codec_history.json" 2>&1 | tail -14
