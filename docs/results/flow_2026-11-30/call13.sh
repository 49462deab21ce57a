#!/usr/bin/env bash
# Run 2026-11-30 06:20 UTC: where the start of a GPU stage goes after a fault. Call 12 found the flow's move to the GPU
# 0.2-0.8 s and the llm's random weights 0.1 s once each process had its CUDA context, against 5.5-7.9 s and 5.3-8.7 s
# in the servers' logs after a fault: so the time is in the contexts (under MPS, after a fault, a new server's clients).
# The contention script again, with context rows; then two faults with each GPU stage's log saying "its CUDA context
# made in X s".
#   bash docs/results/flow_2026-11-30/call13.sh
#
# Predicted (written 06:18 UTC, before the run): see call12_contention.py's header for the script; after each fault
# every GPU stage's context 4-6 s (the new MPS server's start), the rest of each start as alone (the vocoder's flow
# move under 1 s); every GPU stage back 13-17 s as in call 10.
source bench/wheel_site.sh
timeout 150 python3 docs/results/flow_2026-11-30/call12_contention.py 2>&1 | grep -v Warning | tail -22
mv "$OUT/call12.json" "$OUT/call13_contention.json"
STARTS=cold KILLS="fault fault" WAIT_GRAPHS=0 LAST_KILL=$((430 - SECONDS)) timeout $((560 - SECONDS)) \
  bash bench/restart.sh 2>&1 | tail -9
grep -E "died|context made|moved to|weights took|ready in|captured before|serving on" "$OUT/up.log" | cut -c1-170 | tail -40
(cd "$OUT" && tar czf call13.tgz restart up.log && rm -rf restart)
