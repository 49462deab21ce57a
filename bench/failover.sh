#!/usr/bin/env bash
# A session's llm replica killed under load, at the real size on one GPU: `moss-serve up --replicas 2`
# (two llm and two vocoder processes behind one gateway, sharing the GPU through MPS), SESSIONS Converse sessions
# of TURNS turns each (moss-serve bench --turns), and llm-2 SIGKILLed KILL_AFTER seconds in. A session whose turn
# ran on it gets TurnFailed UNAVAILABLE for that turn (the bench ends such a session there); one that was
# between turns moves to the other llm with its history; `up` starts llm-2 again. Expects .whl/ (gpu_smoke.sh).
#   bash bench/failover.sh [moss-serve up flags...]
set -uo pipefail
source "$(dirname "$0")/stack.sh"
SESSIONS=${SESSIONS:-32} TURNS=${TURNS:-3} KILL_AFTER=${KILL_AFTER:-12}
if start_stack --replicas 2 --kv-cache-gb 8 --max-num-seqs 64 "$@"; then
  serve bench --concurrency "$SESSIONS" --requests "$SESSIONS" --turns "$TURNS" --max-new-tokens 75 --warmup 0 \
    --ramp 6 --no-progress --out "$OUT/failover" > "$OUT/failover.log" 2>&1 &
  BENCH=$!
  sleep "$KILL_AFTER"
  # llm-2: the process serving the second replica's port (one started from its spare keeps the spare's command line)
  llm2=$(python3 -c "from services.stack import listener_pid; print(listener_pid(50062) or '')")
  [ -n "$llm2" ] && kill -KILL "$llm2" && echo "killed llm-2 at $(date +%T)"
  wait "$BENCH"
  cat "$OUT/failover.log"
  python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9091/metrics').read().decode())" \
    > "$OUT/failover/metrics_gateway.txt"
  grep -E "^gateway_(session_moves|replica_retries|turn_failures|replica_ready|replica_sessions|sessions_ended)" \
    "$OUT/failover/metrics_gateway.txt"
  grep -E "exited|starting it again|GPU failed" "$OUT/up.log" | cut -c1-200
  # Then every replica back (`up` restarts what died), and sessions speak again through the same gateway.
  for _ in $(seq 1 90); do
    ready=$(python3 -c "import urllib.request; t = urllib.request.urlopen('http://127.0.0.1:9091/metrics').read().decode(); \
print(sum(float(l.split()[-1]) for l in t.splitlines() if l.startswith('gateway_replica_ready{')))")
    [ "${ready%.*}" = 4 ] && break
    sleep 2
  done
  echo "replicas ready: $ready of 4 at $(date +%T)"
  serve bench --concurrency 16 --requests 16 --turns 2 --max-new-tokens 75 --warmup 0 --no-progress \
    --out "$OUT/after" 2>&1 | tail -12
fi
stop_stack
pack_results
