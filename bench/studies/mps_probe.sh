#!/usr/bin/env bash
# Does the stack answer with the llm on a given share of the GPU's multiprocessors (--mps-llm-threads)? On an H100
# on 2026-11-26, 35 and 45 hung it: every service up, no request finished. For each share: start the stack at the
# real size, wait until it is up and warm, send one `say`, then have every service write its threads' Python stacks
# (SIGUSR1) into the log, whether the request finished or not.
#   bash bench/studies/mps_probe.sh 25 45 ...     → $OUT/probe_<share>.{up,say}.log
set -uo pipefail
source "$(dirname "$0")/stack.sh"
for share in "$@"; do
  setsid python3 -c "$SERVE_PY" up --device cuda --preset moss-speech --kv-cache-gb 32 --max-num-seqs 256 \
    --mps-llm-threads "$share" > "$OUT/probe_$share.up.log" 2>&1 &
  STACK_PID=$!
  t0=$SECONDS
  for _ in $(seq 1 90); do grep -q "Ctrl-C stops" "$OUT/probe_$share.up.log" && break; sleep 2; done
  sleep 20  # the services say they serve once they are warm; the gateway waits for their health
  if serve say "Hello there, how are you" -o "$WORK/probe.wav" --max-new-tokens 16 --timeout 45 \
      > "$OUT/probe_$share.say.log" 2>&1; then
    echo "llm on $share%: the request finished ($((SECONDS - t0)) s after start)"
  else
    echo "llm on $share%: no answer: $(tail -1 "$OUT/probe_$share.say.log")"
  fi
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
  for svc in llm vocoder encoder gateway; do
    pid=$(pgrep -f "services.cli $svc " | head -1)
    [ -n "$pid" ] && kill -USR1 "$pid"
  done
  sleep 3
  stop_stack > /dev/null 2>&1
done
