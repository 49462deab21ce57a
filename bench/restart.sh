#!/usr/bin/env bash
# How fast the real-size stack starts and comes back from a stage's SIGKILL, measured from a client on a lent GPU
# machine (docs/benchmarks.md, start-2026-11-29):
#   - a start: `moss-serve up` (FLAGS) to the first turn answered to bench/answer_probe.py (one process's tries, 0.2 s
#     apart; a new `moss-serve say` every 0.5 s before 2026-11-30's call 18, each try 1-2 s of imports), and to the
#     vocoder's "every CUDA graph captured" (waited for until GRAPH_WAIT s after the start, 240 by default); "cold" with
#     Triton's cache in an empty directory, "warm" with it kept;
#   - a kill: under a Poisson load of 10 a second (replies of 2-20 s), the stage SIGKILLed 8 s in; then the seconds to
#     the next turn answered to bench/answer_probe.py (tries from one process, 0.2 s apart), and
#     (bench/restart_report.py, from the load's bench.json and the stack's log) to the
#     stage's return and to the next first audio of a turn the load sent after the kill; and a Converse session
#     answered once before the kill: the seconds to its next answered turn, and whether its history went on.
# Prints a table and writes $OUT/restart.json; each start's and kill's log and load under $OUT/restart/.
#   STARTS="cold warm" KILLS="vocoder llm" bash bench/restart.sh
#   WAIT_GRAPHS=0: a kill 30 s after the last one, not after every graph of the vocoder is captured.
#   LOAD=0: each kill with no load running (the stage idle: does a kill fault its neighbour only mid-work?).
#   KILLS="fault": not a kill but the GPU's MPS clients faulted on purpose (bench/gpu_fault.py), the path a kill that
#   faults a neighbour takes: every GPU stage stopped and started again; "stage back" is the last of llm and vocoder.
set -uo pipefail
source bench/stack.sh
FLAGS=(--kv-cache-gb 32 --max-num-seqs 256 "$@")
DIR=$OUT/restart
mkdir -p "$DIR"
: > "$DIR/events.tsv"
pid_of() {  # SERVICE → the pid serving its gRPC port (one started from its spare keeps the spare's command line)
  python3 -c "import sys; from services.settings import GRPC_PORTS; from services.stack import listener_pid; \
print(listener_pid(GRPC_PORTS[sys.argv[1]]) or '')" "$1"
}
since() { python3 -c "print(round($(date +%s.%N) - $1, 2))"; }

start_timed() {  # LABEL: the stack started now → a "start" event
  local label=$1 t0 turn=null graphs=null
  t0=$(date +%s.%N)
  setsid python3 -c "$SERVE_PY" up --device "${DEVICE:-cuda}" --preset "${PRESET:-moss-speech}" "${FLAGS[@]}" \
    > "$OUT/up.log" 2>&1 &
  STACK_PID=$!
  trap 'exit 143' TERM INT
  trap 'stop_stack; rm -rf "$WORK"' EXIT
  turn=$(python3 bench/answer_probe.py --since "$t0" --limit 200)  # one process's tries, 0.2 s apart
  while [ "$(since "$t0" | cut -d. -f1)" -lt "${GRAPH_WAIT:-240}" ]; do
    if grep -q "every CUDA graph captured" "$OUT/up.log"; then graphs=$(since "$t0"); break; fi
    sleep 0.5
  done
  cp "$OUT/up.log" "$DIR/up_$label.log"
  printf 'start\t%s\t%s\t%s\t%s\n' "$label" "$t0" "$turn" "$graphs" >> "$DIR/events.tsv"
}

export TRITON_CACHE_DIR=$WORK/triton
n=0
for label in ${STARTS:-cold warm}; do
  [ "$n" -gt 0 ] && stop_stack
  [ -e "$DIR/up_$label.log" ] && label=$label$((n + 1))  # a second "warm" is "warm3": each start its own log
  start_timed "$label"
  n=$((n + 1))
done

k=0
for victim in ${KILLS:-vocoder llm}; do
  k=$((k + 1))
  if [ "$SECONDS" -gt "${LAST_KILL:-420}" ]; then echo "kill $k ($victim): skipped, ${SECONDS} s gone"; continue; fi
  if [ "${WAIT_GRAPHS:-1}" = 1 ]; then
    for _ in $(seq 1 120); do [ "$(grep -c "every CUDA graph captured" "$OUT/up.log")" -ge "$k" ] && break; sleep 0.5; done
  else
    sleep 30
  fi
  [ "$victim" = fault ] || before=$(pid_of "$victim")
  lines=$(wc -l < "$OUT/up.log")
  # a session answered once before the kill, its next turns tried after it (bench/answer_probe.py --session)
  python3 bench/answer_probe.py --session "$DIR/session_$k.ready" --since-file "$DIR/kill_$k.t" --limit 150 \
    > "$DIR/session_$k.txt" 2>&1 &
  session=$!
  for _ in $(seq 1 150); do [ -s "$DIR/session_$k.ready" ] && break; sleep 0.2; done
  load=
  if [ "${LOAD:-1}" = 1 ]; then
    serve bench --reply-seconds 2-20 --no-progress --timeout 120 --rate 10 --seconds 25 --warmup 0 \
      --out "$DIR/load_$k" > "$DIR/load_$k.log" 2>&1 &
    load=$!
    sleep 8
  fi
  t0=$(date +%s.%N)
  if [ "$victim" = fault ]; then  # every GPU stage's MPS server faulted on purpose (bench/gpu_fault.py)
    python3 bench/gpu_fault.py --pid "$(pid_of llm)" > "$DIR/fault_$k.txt" 2>&1
    # timed from the illegal store itself, not from this process's start (its imports and CUDA take seconds)
    t0=$(sed -n 's/^fault at //p' "$DIR/fault_$k.txt" | head -1 | grep . || echo "$t0")
  else
    kill -9 "$before"
  fi
  echo "$t0" > "$DIR/kill_$k.t"
  answered=$(python3 bench/answer_probe.py --since "$t0" --limit 150)  # tries from one process, 0.2 s apart
  wait "$session"
  [ -n "$load" ] && wait "$load"
  tail -n +"$((lines + 1))" "$OUT/up.log" > "$DIR/log_kill_$k.txt"
  printf 'kill\t%s\t%s\t%s\t%s\t%s\n' "$victim" "$t0" "$answered" "$k" "$(tail -1 "$DIR/session_$k.txt")" >> "$DIR/events.tsv"
done
stop_stack
python3 bench/restart_report.py "$DIR" --json "$OUT/restart.json"
