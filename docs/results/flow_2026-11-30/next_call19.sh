#!/usr/bin/env bash
# Not run yet (written 2026-11-30 10:00 UTC, for a later session's device time): where a vocoder's flow move waits at a
# warm start. Alone from its spare it takes 0.3 s; beside the llm's and the encoder's starts 4.2-5.4 s, in one pinned
# copy as in ~1,000 (calls 17, 18; docs/benchmarks.md, restarts-2026-11-30b), with 79% of the host idle. The llm's
# weights, 0.05-0.12 s alone, took 5.8-6.9 s at the same starts. Samples of the vocoder's and the llm's native stacks
# (py-spy dump --native, .whl carries its wheel) every 0.7 s from its context to its "flow moved" line, and
# nvidia-smi's view of the GPU's processes and memory beside them.
#   bash docs/results/flow_2026-11-30/next_call19.sh
#
# Predicted (written 2026-11-30 10:00 UTC, before any run): the vocoder's samples in the CUDA driver (cuMemAlloc,
# cuMemcpy or a synchronize) while the llm's are in its KV cache's allocation (32 GiB) or the encoder's places (15.7 GB):
# memory mapping through the one MPS server, serialised across its clients. If instead the vocoder is in Python or
# torch's CPU code, the cause is on the host and this prediction is wrong.
source bench/wheel_site.sh
# the warm start: once the cold one's log is kept and up.log begins again, from the vocoder's context on
(until [ -e "$OUT/restart/up_cold.log" ]; do sleep 0.1; done
 cold=$(wc -l < "$OUT/restart/up_cold.log")
 until [ "$(wc -l < "$OUT/up.log")" -lt "$cold" ] && grep -q "vocoder: its CUDA context made" "$OUT/up.log"; do sleep 0.05; done
 for round in $(seq 1 10); do
   grep -q "flow moved" "$OUT/up.log" && break
   date +%T.%N >> "$OUT/sample.txt"
   nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >> "$OUT/sample.txt" 2>&1
   for port in 50052 50053 50054; do
     pid=$(python3 -c "from services.stack import listener_pid; print(listener_pid($port) or '')")
     [ -z "$pid" ] && pid=$(pgrep -f "services.(spare|cli) .*--port $port" | head -1)
     [ -n "$pid" ] && { echo "== $port $pid" >> "$OUT/sample.txt"; timeout 5 "$SITE/bin/py-spy" dump --native --pid "$pid" >> "$OUT/sample.txt" 2>&1; }
   done
   sleep 0.7
 done) &
STARTS="cold warm" LAST_KILL=0 GRAPH_WAIT=0 timeout 240 bash bench/restart.sh 2>&1 | grep -E "^\|" | head -5
grep -E "context made|weights took|ready in|moved to|places|serving on" "$OUT/restart/up_warm.log" | cut -c1-150
grep -B2 -A14 "^== 50053" "$OUT/sample.txt" | head -60
(cd "$OUT" && tar czf call19.tgz restart sample.txt && rm -rf restart)
