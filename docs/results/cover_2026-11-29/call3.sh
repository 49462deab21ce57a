#!/usr/bin/env bash
# After call 2: before serving, the covers alone (--graphs-before-serving covers, the new default): one window's calls'
# graphs come first while serving, and until then those calls are padded into the covers too. The capture tests on the
# GPU, then bench/restart.sh as call 2: a cold start, three vocoder kills under a Poisson load of 10 a second.
#   bash docs/results/cover_2026-11-29/call3.sh
#
# Predicted (written 2026-11-29 23:06 UTC, before the call): graphs before serving 59 -> 28, 8.3-10 s -> 3-4 s on a
# restart; the vocoder serves again 11-13 s after a kill (16.8-17.4 s in call 2), the load's next first audio with it,
# the `say` probe 14-17 s (19.6-20.5 s); the cold start's first turn 40-45 s (44.4 s); no "run eagerly" line. A kill
# that faults the llm (one of three in call 2) takes ~30 s whatever this changes.
source bench/wheel_site.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_vocoder_capture.py 2>&1 | tail -3
STARTS=cold KILLS="vocoder vocoder vocoder" WAIT_GRAPHS=0 LAST_KILL=$((430 - SECONDS)) timeout $((585 - SECONDS)) bash bench/restart.sh
grep -c "run eagerly" "$OUT/up.log" | sed 's/^/lines "run eagerly" in up.log: /'
grep -E "captured before serving|every CUDA graph captured|admission limit" "$OUT/up.log" | cut -c1-200 | tail -40
(cd "$OUT" && tar czf call3.tgz restart up.log && rm -rf restart)
