#!/usr/bin/env bash
# End-to-end capacity at the real size on one GPU (issue 9): the three services with random weights at the
# MOSS-Speech dimensions and the 24 kHz / 80-band / hop-480 vocoder, then `moss-serve bench` sweeping
# concurrency, each request ~6 s of audio (75 tokens). Expects the wheels of bench/gpu_smoke.sh in .whl/.
#   bash bench/capacity.sh [concurrencies [moss-serve up flags...]]   # default 1,4,16,32,64,128,192,256
# BENCH_ARGS adds flags to the bench (e.g. BENCH_ARGS="--ramp 6"); MPS=0 runs the stack without CUDA MPS.
# SESSIONS="1:4 32:32" then measures Converse on the same stack: CONCURRENCY:SESSIONS levels of TURNS-turn
# sessions (default 3), each turn sent once the reply before it has played out (moss-serve bench --turns).
# Every result ends up in $OUT/results.tgz (the device tool brings back few files), the logs beside it.
set -uo pipefail
source "$(dirname "$0")/stack.sh"
LEVELS=${1:-1,4,16,32,64,128,192,256}
shift $(( $# > 0 ? 1 : 0 ))
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if start_stack --kv-cache-gb 32 --max-num-seqs 256 "$@"; then
  serve bench --concurrency "$LEVELS" --max-new-tokens 75 --warmup 4 --no-progress --out "$OUT/capacity" ${BENCH_ARGS:-} \
    2>&1 | tee "$OUT/capacity.log"
  for level in ${SESSIONS:-}; do
    serve bench --concurrency "${level%%:*}" --requests "${level#*:}" --turns "${TURNS:-3}" --max-new-tokens 75 \
      --warmup 0 --no-progress --out "$OUT/sessions_${level%%:*}" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/sessions.log"
  done
  for s in gateway:9091 llm:9092 vocoder:9093; do  # each service's own view of the sweep
    python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:${s#*:}/metrics').read().decode())" \
      > "$OUT/capacity/metrics_${s%%:*}.txt"
  done
fi
stop_stack
pack_results
