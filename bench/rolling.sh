#!/usr/bin/env bash
# A rolling restart under load, measured from a client: with two replicas serving a steady load, SIGHUP to
# `moss-serve up` restarts them one at a time (services/rolling_restart.py), and no turn admitted during it should fail.
#   - the stack: `moss-serve up` with the flags given (default: two replicas on one GPU, --replicas 2 --kv-cache-gb 16
#     --max-num-seqs 128; `--gpus 0,1` for one a GPU), every vocoder's graphs captured first on a GPU;
#   - a Poisson load of RATE turns a second for LOAD_SECONDS (replies of 2-20 s), SIGHUP HUP_AFTER seconds into it;
#   - bench/rolling_report.py: the turns running at the SIGHUP, sent during the restart and after it, by how they ended,
#     stall-free and TTFA; a table and $OUT/rolling.json (the load's bench.json and the stack's log under $OUT).
#   RATE=5 LOAD_SECONDS=90 HUP_AFTER=10 bash bench/rolling.sh [moss-serve up flags...]
#   DEVICE=cpu PRESET=tiny WHEELS=0 RATE=1 LOAD_SECONDS=40 HUP_AFTER=5 bash bench/rolling.sh --replicas 2   # a CPU check
set -uo pipefail
source bench/stack.sh
FLAGS=("$@")
[ ${#FLAGS[@]} -eq 0 ] && FLAGS=(--replicas 2 --kv-cache-gb 16 --max-num-seqs 128)
start_stack "${FLAGS[@]}" || exit 1
vocoders=$(python3 -c "import sys; a = sys.argv[1:]; print(int(a[a.index('--replicas') + 1]) if '--replicas' in a \
  else len(a[a.index('--gpus') + 1].split(',')) if '--gpus' in a else 1)" "${FLAGS[@]}")
if [ "${DEVICE:-cuda}" != cpu ]; then  # a load before every graph is in would measure the captures, not the restart
  for _ in $(seq 1 300); do
    [ "$(grep -c "every CUDA graph captured" "$OUT/up.log")" -ge "$vocoders" ] && break
    sleep 0.5
  done
fi
serve bench --rate "${RATE:-5}" --seconds "${LOAD_SECONDS:-90}" --reply-seconds 2-20 --timeout 120 --warmup 0 \
  --no-progress --out "$OUT/rolling" > "$OUT/rolling_load.log" 2>&1 &
load=$!
sleep "${HUP_AFTER:-10}"
hup=$(date +%s.%N)
kill -HUP "$STACK_PID"
done_at=null
for _ in $(seq 1 1200); do  # (this loop notes when the round's last line came)
  if grep -qE "rolling restart: (done|stopped)" "$OUT/up.log"; then done_at=$(date +%s.%N); break; fi
  sleep 0.5
done
wait "$load"
grep "rolling restart" "$OUT/up.log"
stop_stack
python3 bench/rolling_report.py "$OUT/rolling/bench.json" --hup "$hup" --done "$done_at" --json "$OUT/rolling.json"
