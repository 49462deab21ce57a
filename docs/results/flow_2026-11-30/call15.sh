#!/usr/bin/env bash
# Run 2026-11-30 08:40 UTC (written 2026-11-30 06:30 UTC): the fate-shared path again, now that
# the supervisor makes spares again only once the restarted stages serve. Calls 10 and 13 found each step of the GPU
# stages' starts after a fault 20-170x slower than alone (the llm's random weights 5.3-8.7 s against 0.06 s; the
# flow's move 5.5-7.9 s against 0.15 s; call 14: not the dead processes' memory, not the contexts), with the new spares'
# imports and reads ahead (torch, Triton, the codec built on the CPU, the encoder's weights) on every core beside them.
#   bash docs/results/flow_2026-11-30/next_call15.sh
#
# Predicted (written 2026-11-30 06:30 UTC, before any run): if the spares were the cause, after each fault the weights
# ~1 s, the move under 1 s, every GPU stage back 8-11 s (13-27 s in calls 10 and 13); if not, as before, and the cause
# is the load's gateway or the three starts themselves (then run call12_contention.py with a CPU load beside it). The
# report's "found" column (new): 0.2 s for each fault, or, if a fault is found ~10 s late again (1 of 2 in calls 10 and
# 13), fault_K.txt's "faulted at" tells whether gpu_fault's own store waited (its time ~10 s after "fault at") or the
# stages' finding it did (its time within 0.1 s). The samples: the llm in random_model's module building or its init
# kernels and the vocoder in `.to`, with the new spares' imports on the busiest cores if they were the cause.
source bench/wheel_site.sh
# Where the starts' seconds go: at the first restart of every stage, three rounds ~1.5 s apart of the host's busiest
# processes (top) and of each service's and spare's Python stack (py-spy dump --native: the C++ frames too, an
# OpenMP barrier or a driver call; it pauses each process a moment, so the first fault's row is not a clean one;
# .whl carries py-spy's wheel).
(until grep -q "died (3)" "$OUT/up.log" 2>/dev/null; do sleep 0.2; done
 for round in 1 2 3; do
   sleep 1.5; date +%T.%N >> "$OUT/sample.txt"; top -b -n 1 -w 220 | head -30 >> "$OUT/sample.txt"
   for pid in $(pgrep -f "services.(spare|cli) (llm|vocoder|encoder)"); do
     echo "== $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-90)" >> "$OUT/sample.txt"
     timeout 5 "$SITE/bin/py-spy" dump --native --pid "$pid" >> "$OUT/sample.txt" 2>&1
   done
 done) &
STARTS=cold KILLS="fault fault fault" WAIT_GRAPHS=0 LAST_KILL=$((440 - SECONDS)) timeout $((570 - SECONDS)) \
  bash bench/restart.sh 2>&1 | tail -18
grep -E "died|context made|moved to|weights took|ready in|captured before|serving on" "$OUT/up.log" | cut -c1-170 | tail -40
grep -A12 "^top -" "$OUT/sample.txt" | head -16
(cd "$OUT" && tar czf call15.tgz restart up.log sample.txt && rm -rf restart)
