#!/usr/bin/env bash
# After call 1: the prompt prefix's first free place run through once at the start (prefix.py: a stand-in of an odd
# prompt length), so that the first voice made through the API does not have Triton compile while the vocoder's calls
# wait. In order:
#   1. bench/gpu_smoke.sh tests-codec: every codec GPU test on this tree (the prefix's places reused, the free place
#      run at start);
#   2. bench/voices.py's own stack at the defaults, a 10.06 s recording, 3 voices alone then 3 beside 64 streams,
#      straight after the stack answers (its graphs still being captured in the background).
#   bash docs/results/voices_spoken_2026-11-29/call2.sh
#
# Predicted (written 2026-11-29 20:14 UTC, before the call): 1. every test passes. 2. the first voice alone 0.5-0.8 s
# (4.13 s in call 1, then 0.57-0.59 s); beside 64 streams 0.5-0.8 s, the streams 100% stall-free.
source bench/wheel_site.sh
timeout 330 bash bench/gpu_smoke.sh tests-codec 2>&1 | tail -8
timeout 240 python3 bench/voices.py --up-args "--device cuda --preset moss-speech --kv-cache-gb 32 --max-num-seqs 256" \
  --streams 64 --recording .whl/inputs/recording.flac --speaker-model .whl/inputs/speaker.onnx --trials 3 \
  --json "$OUT/voices_call2.json" 2>&1 | tail -9
