#!/usr/bin/env bash
# What a SIGKILLed MPS client does to its neighbour, on this tree: the stack at its defaults but `--no-mps-shared-fate`
# (up restarts the dead stage alone), a steady load (Poisson 10 a second, replies of 2-20 s) so that both stages have
# kernels in flight, one stage SIGKILLed 8 s into it. For each trial: the survivor's PID before and after (a survivor
# that lost its GPU context exits with code 3 and is started again), the CUDA and MPS errors in the stack's log
# since the kill, the load's failed turns, and the seconds from the kill to the next answered turn. Everything in
# $OUT/call1.tgz.
#   bash docs/results/restart_2026-11-29/call1.sh
#   VICTIMS="llm llm" bash docs/results/restart_2026-11-29/call1.sh   # (call 2: the llm twice more)
#
# Predicted (written 2026-11-29 13:10 UTC, before the call; an H200). NVIDIA's MPS documentation: a fatal GPU
# exception in one client is reported to every client of the server, which then takes no new client until all of
# them have exited; a client's plain exit is cleaned up without touching the others. A SIGKILL lands between the two:
# the driver tears the killed process's channels down with kernels in flight. Earlier runs on an H100 saw a
# neighbour fault in some runs and not others. Predicted here: in most trials the survivor keeps serving (same PID,
# no CUDA error), the turns in flight on the killed stage fail UNAVAILABLE and the rest pass; the next turn is
# answered once the killed stage is back: ~35-45 s for the llm, ~90-110 s for the vocoder (its CUDA graphs are
# captured again at start: 88 s in the issue's cold start).
set -uo pipefail
source bench/stack.sh
mkdir -p "$OUT/f"
pid_of() { pgrep -f "services.cli $1 " | head -1; }
errors() { grep -ciE "illegal memory|CUDA error|cudaError|not ready to accept|MPS server|device lost|exited with code 3" "$1"; }
if start_stack --kv-cache-gb 32 --max-num-seqs 256 --no-mps-shared-fate; then
  k=0
  for victim in ${VICTIMS:-vocoder llm vocoder}; do
    k=$((k + 1))
    if [ "$SECONDS" -gt 330 ]; then echo "trial $k ($victim): skipped, ${SECONDS} s gone"; continue; fi
    llm_before=$(pid_of llm); voc_before=$(pid_of vocoder)
    lines=$(wc -l < "$OUT/up.log")
    serve bench --reply-seconds 2-20 --no-progress --timeout 120 --rate 10 --seconds 25 --warmup 0 \
      --out "$OUT/f/load_$k" > "$OUT/f/load_$k.log" 2>&1 &
    load=$!
    sleep 8
    t0=$(date +%s.%N)
    kill -9 "$(pid_of "$victim")"
    until serve say "after the kill" -o "$WORK/after.wav" --max-new-tokens 8 --timeout 15 > /dev/null 2>&1; do
      sleep 0.5
      if [ "$(python3 -c "print(int($(date +%s.%N) - $t0))")" -gt 200 ]; then echo "  no turn answered 200 s after the kill"; break; fi
    done
    t1=$(date +%s.%N)
    wait "$load"
    tail -n +"$((lines + 1))" "$OUT/up.log" > "$OUT/f/log_$k.txt"
    echo "trial $k: killed the $victim; next turn answered $(python3 -c "print(round($t1 - $t0, 1))") s later;" \
      "llm pid $llm_before -> $(pid_of llm), vocoder pid $voc_before -> $(pid_of vocoder);" \
      "error lines since the kill: $(errors "$OUT/f/log_$k.txt")"
    grep -iE "illegal memory|CUDA error|cudaError|not ready to accept|device lost|exited with code|died|starting it again" \
      "$OUT/f/log_$k.txt" | cut -c1-220 | head -8 | sed 's/^/    /'
    grep -A3 "^| streams" "$OUT/f/load_$k/bench.md" 2> /dev/null | sed -n 3p | sed 's/^/    load: /'
    sleep 5
  done
  stop_stack
fi
(cd "$OUT" && tar czf "${TGZ:-call1.tgz}" f up.log && rm -rf f)
