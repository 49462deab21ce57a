#!/usr/bin/env bash
# The rolling restart again (call 2: 0 admitted turns failed, but the second replica was drained while the first,
# just back, still had 190 graphs to capture: the admission limit fell 48 -> 5 and 54 of 91 turns sent after the round
# were refused). Now the next replica is drained only once the restarted one is warm (every graph captured, or 150 s),
# and each restart is its spare's. Then bench/codec_history.py --beside-llm, if time is left.
#   bash docs/results/flow_2026-11-30/call4.sh
#
# Predicted (written 2026-11-30 01:41 UTC, before the call): the round takes 120-200 s (each replica: a drain of
# ~11-15 s, back in ~6-9 s from its spare, warm 40-90 s later); 0 admitted turns fail; the limit stays >= 20 after the
# round, and turns sent after it are refused at most as often as before the SIGHUP.
source bench/wheel_site.sh
RATE=5 LOAD_SECONDS=170 HUP_AFTER=10 timeout 380 bash bench/rolling.sh 2>&1 | tail -18
grep -E "admission limit" "$OUT/up.log" | tail -6 | cut -c1-160
(cd "$OUT" && tar czf call4.tgz up.log rolling_load.log rolling 2>/dev/null && rm -rf rolling)
timeout $((570 - SECONDS)) python3 bench/codec_history.py --streams 1,32 --modes history --beside-llm \
  --json "$OUT/codec_history.json" > "$OUT/codec_history.log" 2>&1
echo "codec_history exit $?"
grep -nE "Error|Traceback" "$OUT/codec_history.log" | head -5
tail -8 "$OUT/codec_history.log"
