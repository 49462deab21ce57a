#!/usr/bin/env bash
# The real-size random stack on one GPU, as a user starts it:
#   moss-serve up --device cuda --preset moss-speech ... ; moss-serve say "..."
# Expects the wheels of bench/gpu_smoke.sh in .whl/. Prints each `say`'s per-stage timings.
set -uo pipefail
source "$(dirname "$0")/stack.sh"
if start_stack --kv-cache-gb 16 --max-num-seqs 32; then
  for i in 1 2 3; do
    serve say "Hello! Tell me about the weather today, please." -o "$OUT/say_$i.wav" --max-new-tokens 75 --seed $i \
      2>&1 | tee -a "$OUT/say.log"
  done
fi
stop_stack
