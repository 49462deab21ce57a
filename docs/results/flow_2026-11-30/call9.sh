#!/usr/bin/env bash
# Run 2026-11-30 (session 2), after calls 7 and 8: the fault path again, with the vocoder's spare holding its codec read
# ahead on the CPU (cli.py's read_ahead; in call 8 building it took 3.5 s of the vocoder's 17.5 s back beside the
# others' starts). Two faults on purpose only: the session's device time was nearly spent.
#   bash docs/results/flow_2026-11-30/call9.sh
#
# Predicted (written 2026-11-30 03:49 UTC, before the call): every GPU stage back 13-16 s after the illegal store
# (call 8: 15.9 and 19.2 s), the load's next first audio within 0.5 s of that; the vocoder's log says its codec was
# read ahead.
source bench/wheel_site.sh
STARTS=cold KILLS="fault fault" WAIT_GRAPHS=0 LAST_KILL=$((200 - SECONDS)) timeout $((260 - SECONDS)) \
  bash bench/restart.sh
grep -E "died|from its spare|read ahead|loaded in|captured before|serving on" "$OUT/up.log" | cut -c1-150 | tail -24
(cd "$OUT" && tar czf call9.tgz restart up.log && rm -rf restart)
