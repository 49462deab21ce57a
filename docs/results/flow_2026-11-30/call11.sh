#!/usr/bin/env bash
# Run 2026-11-30 06:10 UTC (written earlier that day): the rolling restart again with a load that
# outlasts the round (call 7's ended first, so the turns after the round, the reason for the warm wait, went
# unmeasured): Poisson 5/s for 330 s, SIGHUP 10 s in.
#   bash docs/results/flow_2026-11-30/next_call11.sh
#
# Predicted (written 2026-11-30 04:11 UTC, before any run): a round of 200-250 s; 0 admitted turns fail; during the
# round 20-30% refused (call 7: 28%); after it at most 10% refused, against 54 of 91 in call 2 before the warm wait.
source bench/wheel_site.sh
RATE=5 LOAD_SECONDS=330 HUP_AFTER=10 timeout 570 bash bench/rolling.sh 2>&1 | tail -14
grep -E "rolling restart|admission limit" "$OUT/up.log" | tail -16 | cut -c1-160
(cd "$OUT" && tar czf call11.tgz up.log rolling_load.log rolling 2>/dev/null && rm -rf rolling)
