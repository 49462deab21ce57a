#!/usr/bin/env bash
# End-to-end capacity at the real size on one GPU: the three services with random weights at the
# MOSS-Speech dimensions and the 24 kHz / 80-band / hop-480 vocoder, then `moss-serve bench` sweeping
# concurrency, each request ~6 s of audio (75 tokens). Expects the wheels of bench/gpu_smoke.sh in .whl/.
#   bash bench/capacity.sh [concurrencies [moss-serve up flags...]]   # default 1,4,16,32,64,128,192,256
# BENCH_ARGS adds flags to the bench (e.g. BENCH_ARGS="--ramp 6"); MPS=0 runs the stack without CUDA MPS.
# WAVES=3 then measures each level by the definition too (shared/DESIGN.md §6, "started over 6 s"): as many
# streams as the level, one request each, started over --ramp; WAVES times, each in $OUT/wave_<level>_<k>. The
# sweep itself sends 4 requests per stream, each as soon as the last one's audio has all arrived (faster than it
# plays): at 128 that keeps ~190 listeners playing, a harder load than 128 streams started once.
# SESSIONS="1:4 32:32" then measures Converse on the same stack: CONCURRENCY:SESSIONS levels of TURNS-turn
# sessions (default 3), each turn sent once the reply before it has played out (moss-serve bench --turns).
# SWEEP=0 skips the sweep (with WAVES: the definition's waves only).
# Every result ends up in $OUT/results.tgz (the device tool brings back few files), the logs beside it.
set -uo pipefail
source "$(dirname "$0")/stack.sh"
LEVELS=${1:-1,4,16,32,64,128,192,256}
shift $(( $# > 0 ? 1 : 0 ))
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if start_stack --kv-cache-gb 32 --max-num-seqs 256 "$@"; then
  if [ "${SWEEP:-1}" != 0 ]; then
    serve bench --concurrency "$LEVELS" --max-new-tokens 75 --warmup 4 --no-progress --out "$OUT/capacity" ${BENCH_ARGS:-} \
      2>&1 | tee "$OUT/capacity.log"
  fi
  for level in $( [ "${WAVES:-0}" -gt 0 ] && echo "${LEVELS//,/ }" ); do
    for k in $(seq 1 "$WAVES"); do
      serve bench --concurrency "$level" --requests "$level" --max-new-tokens 75 --warmup 2 --no-progress \
        --out "$OUT/wave_${level}_$k" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/waves.log"
    done
  done
  for level in ${SESSIONS:-}; do
    serve bench --concurrency "${level%%:*}" --requests "${level#*:}" --turns "${TURNS:-3}" --max-new-tokens 75 \
      --warmup 0 --no-progress --out "$OUT/sessions_${level%%:*}" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/sessions.log"
  done
  mkdir -p "$OUT/capacity"
  for s in gateway:9091 llm:9092 vocoder:9093; do  # each service's own view of the sweep
    scrape "${s#*:}" "$OUT/capacity/metrics_${s%%:*}.txt"
  done
fi
stop_stack
pack_results
