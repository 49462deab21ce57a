#!/usr/bin/env bash
# Run 2026-11-30 (session 2), after call 8: the rolling restart with spares (two per stage) and the warm wait (call 2
# had neither). bench/codec_history.py --beside-llm, planned here too, was left for a later call (device time).
#   bash docs/results/flow_2026-11-30/call7.sh
#
# Predicted (written 2026-11-30 02:03 UTC, before any run): a round of 120-200 s; 0 admitted turns fail; the admission
# limit stays >= 20 after the round, and turns sent after it are refused at most as often as before the SIGHUP.
# codec_history: alone a first call ~22 ms and 32 streams steady ~60 ms; beside the llm 1.5-2.5x those, the llm's step
# 9-12 ms (6.4 alone).
source bench/wheel_site.sh
RATE=5 LOAD_SECONDS=150 HUP_AFTER=10 timeout 420 bash bench/rolling.sh 2>&1 | tail -14
grep -E "rolling restart|admission limit" "$OUT/up.log" | tail -12 | cut -c1-160
(cd "$OUT" && tar czf call7.tgz up.log rolling_load.log rolling 2>/dev/null && rm -rf rolling)
