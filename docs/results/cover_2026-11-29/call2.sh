#!/usr/bin/env bash
# A vocoder SIGKILLed under load comes back with its covers (capture.py): every call of the restarted vocoder replays
# a graph from its first, padded where its own is not captured yet, and no call holds the others for a capture. And
# the headroom rule no longer reads a turn's wait for a stage that was not ready as slow first audio (pipeline.py).
# First the capture tests on the GPU (call 1's tests-codec ran out of time at 90% and did not list them); then
# bench/restart.sh: a cold start, then three vocoder kills under a Poisson load of 10 a second (30 s apart, the
# restarted vocoder's graphs still being captured); then how many calls ran eagerly.
#   bash docs/results/cover_2026-11-29/call2.sh
#
# Predicted (written 2026-11-29 22:47 UTC, before the call): the vocoder serves again 16-20 s after a kill (+1-2 s of
# covers before serving: 2 flow graphs at ~0.7 s, ~30 generator graphs at ~25 ms); the load's next first audio within
# a second of that; the `say` probe 17-24 s after the kill (24.8-37.3 s before: the load's turns after the restart
# stalled for seconds on eager calls and captures, and the limit fell to 9); no "run eagerly" line after a restart;
# the cold start 45-50 s to a first turn (44-46 s before).
source bench/wheel_site.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_vocoder_capture.py 2>&1 | tail -3
STARTS=cold KILLS="vocoder vocoder vocoder" WAIT_GRAPHS=0 LAST_KILL=$((430 - SECONDS)) timeout $((585 - SECONDS)) bash bench/restart.sh
grep -c "run eagerly" "$OUT/up.log" | sed 's/^/lines "run eagerly" in up.log: /'
grep -E "captured before serving|every CUDA graph captured|admission limit" "$OUT/up.log" | cut -c1-200 | tail -40
(cd "$OUT" && tar czf call2.tgz restart up.log && rm -rf restart)
