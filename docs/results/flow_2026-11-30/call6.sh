#!/usr/bin/env bash
# Run 2026-11-30 (session 2). The restart path left unmeasured:
# bench/restart.sh with KILLS="vocoder fault llm fault": a fault on purpose (bench/gpu_fault.py) takes the path a
# kill that faults a neighbour takes (every GPU stage stopped and started again, now from spares).
#   bash docs/results/flow_2026-11-30/call6.sh
#
# Predicted (written 2026-11-30 02:03 UTC, before any run): a fault: every GPU stage back 10-13 s after it (the llm's
# and the vocoder's spare starts side by side; 20.1-27.0 s before spares), `say` 11-15 s; the kills as in call 5
# (vocoder ~10 s, llm ~8 s).
source bench/wheel_site.sh
STARTS=cold KILLS="vocoder fault llm fault" WAIT_GRAPHS=0 LAST_KILL=$((420 - SECONDS)) timeout $((560 - SECONDS)) \
  bash bench/restart.sh
grep -E "died|as asked|starting it again|from its spare|spare for|spare exited|faulted" "$OUT/up.log" | cut -c1-200 | tail -20
(cd "$OUT" && tar czf call6.tgz restart up.log && rm -rf restart)
