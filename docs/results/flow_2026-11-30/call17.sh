#!/usr/bin/env bash
# Run 2026-11-30 09:00 UTC (rc 0, 488 s): issue 61's targets on one tree, from a client: a cold and a warm start, then a
# vocoder's SIGKILL, an llm's, and a fault on purpose, each 8 s into a Poisson load of 10 a second; and new, a Converse
# session answered once before each kill, its next turns tried after it (bench/answer_probe.py --session): when one is
# answered, and whether its prompt holds the first turn (the history went on).
#   bash docs/results/flow_2026-11-30/call17.sh
#
# Predicted (written 2026-11-30 09:00 UTC, before the call): cold 33-47 s to the first answered turn, warm
# 22-27 s (26.1 s on 2026-11-29, before spares); the vocoder's kill back in 9-11 s, the probe 10-12 s; the llm's back
# 7-9 s, the probe 8-10 s (either may fault the other, 7 of 21 and 2 of 9 so far: then 12-16 s); the fault 11-16 s,
# the probe 12-20 s. The session's next turn within ~1 s of the probe's, its history "yes" in every row.
source bench/wheel_site.sh
STARTS="cold warm" KILLS="vocoder llm fault" WAIT_GRAPHS=0 LAST_KILL=$((450 - SECONDS)) timeout $((575 - SECONDS)) \
  bash bench/restart.sh 2>&1 | tail -16
grep -E "died|exited with code|from its spare" "$OUT/up.log" | cut -c1-170 | tail -12
(cd "$OUT" && tar czf call17.tgz restart up.log && rm -rf restart)
