#!/usr/bin/env bash
# Three bursts of 96 in a row on one embedded-default stack (`moss-serve up`, no flags; each `moss-serve bench` runs its
# two warm-up turns first), three ways of running the stages' OpenMP threads: as they come, OMP_WAIT_POLICY=PASSIVE,
# OMP_NUM_THREADS=1. ARMS=default for one arm. Results: /tmp/omp/ (bench_json.tgz here: before_*, and after_* for the
# arm run again on the fixed rule).
# Predicted (2026-11-29 15:25 UTC): OpenMP's spinning threads take the cores the gateway needs; passive or one thread
# a stage brings the refusals' p95 from ~70 ms to under 50 ms.
cd /work/main
B=.venv/bin
for arm in ${ARMS:-default passive threads1}; do
  case $arm in
    default) envs=();;
    passive) envs=(OMP_WAIT_POLICY=PASSIVE);;
    threads1) envs=(OMP_NUM_THREADS=1);;
  esac
  env "${envs[@]}" setsid $B/moss-serve up > /tmp/omp/up_$arm.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do $B/moss-serve say "warm up" -o /tmp/omp/w.wav --max-new-tokens 8 --timeout 20 > /dev/null 2>&1 && break; sleep 1; done
  for r in 1 2 3; do
    $B/moss-serve bench --concurrency 96 --requests 96 --reply-seconds 3-8 --no-progress --out /tmp/omp/${arm}_$r > /tmp/omp/${arm}_$r.log 2>&1
    echo "$arm run $r: $(grep -A3 '^| streams' /tmp/omp/${arm}_$r/bench.md | sed -n 3p)"
  done
  kill -TERM $pid; wait $pid; pkill -KILL -g $pid 2>/dev/null
  sleep 3
done
