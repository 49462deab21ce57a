#!/usr/bin/env bash
# Where the time goes in the real-size stack under load: while `moss-serve bench` holds one
# concurrency level, sample each service with py-spy (Python stacks, all threads), the GPU with
# `nvidia-smi dmon` and the processes' CPU with top; scrape every service's /metrics before and after. Out:
# $OUT/profile.tgz (py-spy's collapsed stacks, one line per stack and its sample count; the bench's files; the
# scrapes: subtract before from after for the level's counts and sums). Expects the wheels of
# bench/gpu_smoke.sh and py-spy's in .whl/.
#   bash bench/studies/profile_stack.sh [concurrency] [requests] [moss-serve up flags...]
set -uo pipefail
source "$(dirname "$0")/stack.sh"
LEVEL=${1:-128}
REQUESTS=${2:-1024}
shift 2 2>/dev/null || shift $#
scrape() {  # $1: a label
  for s in gateway:9091 llm:9092 vocoder:9093; do
    python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:${s#*:}/metrics').read().decode())" \
      > "$OUT/metrics_$1_${s%%:*}.txt" || echo "scrape of ${s%%:*} failed"
  done
}
if start_stack --kv-cache-gb 32 --max-num-seqs 256 "$@"; then
  scrape before
  serve bench --concurrency "$LEVEL" --requests "$REQUESTS" --max-new-tokens 75 --warmup 4 --no-progress \
    --out "$OUT/profile_bench" > "$OUT/profile_bench.log" 2>&1 &
  BENCH=$!
  sleep 10  # past warm-up and ramp: the level is steady
  nvidia-smi dmon -s u -c 8 > "$OUT/dmon.txt" 2>&1 &
  top -b -n 2 -d 6 -w 200 > "$OUT/top.txt" 2>&1 &
  for svc in llm vocoder gateway; do
    pid=$(pgrep -f "services.cli $svc " | head -1)
    "$WORK/site/bin/py-spy" record --pid "$pid" --duration 8 --rate 200 --nonblocking --threads --format raw \
      -o "$OUT/pyspy_$svc.txt" > "$OUT/pyspy_$svc.log" 2>&1 &
  done
  wait_bench() { while kill -0 "$BENCH" 2>/dev/null; do sleep 1; done; }
  sleep 9
  wait_bench
  tail -12 "$OUT/profile_bench.log"
  scrape after
fi
stop_stack
# At most 8 files come back from a lent machine: everything in one archive.
tar -czf "$WORK/profile.tgz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "$WORK/profile.tgz" "$OUT/" && echo "wrote $OUT/profile.tgz"
