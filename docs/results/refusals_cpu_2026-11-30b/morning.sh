#!/usr/bin/env bash
# As run 2026-11-30 12:16 UTC: the same script at the commit of the morning's figures (3004912, checked out with
# `git worktree add /tmp/old 3004912`), run from there with this tree's venv. ARMS=on.
# The embedded default on this 2-core machine (`moss-serve up`, no flags), two arms: `--admit-start-quiet 0` (an
# admitted turn starts at once) and the default (on a CPU: once no call has come in for 5 ms, at most 30 ms). Each arm:
#   - bench/refusal_floor.py: bursts of 96 at the gateway, made full by 4 long turns that play throughout, and at a bare
#     grpc.aio server that refuses at once, in turn from one client (the floor on the same busy machine);
#   - three bursts of 96 with `moss-serve bench` (as docs/results/cpu_bursts_2026-11-29/run.sh): some admitted.
#   bash docs/results/refusals_cpu_2026-11-30/run.sh          # results: /tmp/refusals/, floor_<arm>.json here
# Predicted (written 2026-11-30 04:26 UTC, from ad hoc runs the same hour, a fixed 30 ms wait patched in): the floor's
# p95 30-46 ms; the gateway's 60-80 ms without the wait, 27-45 ms with it; the bench's refusal p95 under 50 ms in
# most bursts with it, and the admitted turns still 100% stall-free.
cd /tmp/old
B=/work/main/.venv/bin
mkdir -p /tmp/refusals
for arm in ${ARMS:-off on}; do
  flags=(); [ "$arm" = off ] && flags=(--admit-start-quiet 0)
  setsid $B/python -m services.cli up "${flags[@]}" > /tmp/refusals/up_$arm.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do $B/python -m services.cli say "warm up" -o /tmp/refusals/w.wav --max-new-tokens 8 --timeout 20 > /dev/null 2>&1 && break; sleep 1; done
  echo "arm $arm:"
  $B/python bench/refusal_floor.py --burst 96 --reps 6 --target 127.0.0.1:50051 --hold 4 \
    --json /tmp/refusals/floor_old_$arm.json | tail -n +5
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
