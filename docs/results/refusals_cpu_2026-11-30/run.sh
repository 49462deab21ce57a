#!/usr/bin/env bash
# The embedded default on this 2-core machine (`moss-serve up`, no flags), two arms: `--admit-start-quiet 0` (an
# admitted turn starts at once) and the default (on a CPU: once no call has come in for 5 ms, at most 30 ms). Each arm:
#   - bench/refusal_floor.py: bursts of 96 at the gateway, made full by 4 long turns that play throughout, and at a bare
#     grpc.aio server that refuses at once, in turn from one client (the floor on the same busy machine);
#   - three bursts of 96 with `moss-serve bench` (as docs/results/cpu_bursts_2026-11-29/run.sh): some admitted.
#   bash docs/results/refusals_cpu_2026-11-30/run.sh          # results: /tmp/refusals/, floor_<arm>.json here
# Predicted (written 2026-11-30 04:26 UTC, from ad hoc runs the same hour, a fixed 30 ms wait patched in): the floor's
# p95 30-46 ms; the gateway's 60-80 ms without the wait, 27-45 ms with it; the bench's refusal p95 under 50 ms in
# most bursts with it, and the admitted turns still 100% stall-free.
# Also (2026-11-30, afternoon: docs/benchmarks.md, refusals-cpu-2026-11-30b): arm t0, `up --cpu-threads 0`; ROOT, the
# tree whose code runs (default: this one; a `git worktree` of another commit runs that commit's with this tree's venv);
# FLOOR_DIR and TAG, where the floor's JSON goes and its name's prefix (default: this directory, none).
#   ARMS="on t0" FLOOR_DIR=docs/results/refusals_cpu_2026-11-30b bash docs/results/refusals_cpu_2026-11-30/run.sh
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
B=$HERE/.venv/bin
floors=${FLOOR_DIR:-$HERE/docs/results/refusals_cpu_2026-11-30}
case $floors in /*) ;; *) floors=$HERE/$floors ;; esac
cd "${ROOT:-$HERE}"
mkdir -p /tmp/refusals
for arm in ${ARMS:-off on}; do
  flags=(); [ "$arm" = off ] && flags=(--admit-start-quiet 0); [ "$arm" = t0 ] && flags=(--cpu-threads 0)
  setsid $B/python -m services.cli up "${flags[@]}" > /tmp/refusals/up_$arm.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do $B/python -m services.cli say "warm up" -o /tmp/refusals/w.wav --max-new-tokens 8 --timeout 20 > /dev/null 2>&1 && break; sleep 1; done
  echo "arm $arm:"
  $B/python bench/refusal_floor.py --burst 96 --reps 6 --target 127.0.0.1:50051 --hold 4 \
    --json "$floors/floor_${TAG:-}$arm.json" | tail -n +5
  sleep 5
  for r in 1 2 3; do
    $B/python -m services.cli bench --concurrency 96 --requests 96 --reply-seconds 3-8 --no-progress --out /tmp/refusals/${arm}_$r \
      > /tmp/refusals/${arm}_$r.log 2>&1
    echo "bench $r: $(grep -A3 '^| streams | ok' /tmp/refusals/${arm}_$r/bench.md | sed -n 3p | cut -d'|' -f2-4,11) \
refusal p95 $(grep -A2 '^| streams | offered' /tmp/refusals/${arm}_$r/bench.md | sed -n 3p | cut -d'|' -f8)"
  done
  kill -TERM $pid; wait $pid; pkill -KILL -g $pid 2>/dev/null
  sleep 3
done
