#!/usr/bin/env bash
# Spoken turns at the real size on one GPU: the four services with random weights at the MOSS-Speech
# dimensions, then `moss-serve bench --speech WAV`: Converse sessions whose turns are the WAV streamed as it would be
# spoken (100 ms chunks, in real time: the encoder works while it plays), then its end; each turn's time to first
# audio runs from the end of the speech. The same stack answers typed turns first, the baseline.
# Expects the wheels of bench/gpu_smoke.sh (and silero-vad's) in .whl/, and the WAV (any rate; espeak-ng makes one).
#   bash bench/spoken.sh WAV [sessions [moss-serve up flags...]]      # sessions: a sweep, default 1,16
set -uo pipefail
source "$(dirname "$0")/stack.sh"
SPEECH=$1
LEVELS=${2:-1,16}
shift $(( $# > 1 ? 2 : 1 ))
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if start_stack --kv-cache-gb 32 --max-num-seqs 256 "$@"; then
  serve bench --concurrency 1 --requests 10 --max-new-tokens 75 --warmup 2 --no-progress --out "$OUT/typed" \
    2>&1 | tee "$OUT/typed.log"
  serve bench --speech "$SPEECH" --concurrency "$LEVELS" --turns "${TURNS:-2}" --max-new-tokens 75 --warmup 1 \
    --no-progress --out "$OUT/spoken" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/spoken.log"
  for s in gateway:9091 llm:9092 vocoder:9093 encoder:9094; do
    python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:${s#*:}/metrics').read().decode())" \
      > "$OUT/spoken/metrics_${s%%:*}.txt"
  done
fi
stop_stack
pack_results
