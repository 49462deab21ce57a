#!/usr/bin/env bash
# Run 2026-11-30 09:17 UTC (rc 0, 112 s; at commit cda6531): the stack's start, cold then warm twice (no kills), after two changes: the flow moves to
# the GPU in one copy (services/common/module_move.py), and the first answered turn is timed by bench/answer_probe.py
# (one process, tries 0.2 s apart) rather than a new `moss-serve say` every 0.5 s (1-2 s of imports a try).
#   bash docs/results/flow_2026-11-30/call18.sh
#
# Predicted (written 2026-11-30 09:17 UTC, before the call): call 17's warm start answered at 31.1 s, the vocoder
# serving at 29.2 s with its flow's move 4.2 s beside the llm's KV cache, graphs and warm-up. If the move's thousand
# synchronous copies were what waited: the move under 1 s, the vocoder serving at 25-27 s, the first turn answered
# 0.2-0.6 s after it (26-28 s warm); cold 40-50 s (48.4 s). If the move is ~4 s again, the copies were not the cause.
source bench/wheel_site.sh
STARTS="cold warm warm" LAST_KILL=0 GRAPH_WAIT=0 timeout 280 bash bench/restart.sh 2>&1 | grep -E "^\|" | head -6
for f in "$OUT"/restart/up_*.log; do
  echo "== $f"; grep -E "context made|weights took|ready in|moved to|captured before|serving on" "$f" | cut -c1-150
done
(cd "$OUT" && tar czf call18.tgz restart up.log && rm -rf restart)
