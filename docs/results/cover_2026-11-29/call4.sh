#!/usr/bin/env bash
# After call 3: the GPU stages stopped beside one that faulted the MPS server start again at once, not after a
# failure's backoff (up.py: MpsKeeper tells the supervisor it asked them to exit; the vocoder had waited 2 s). More
# kills for the fault's frequency and the llm's kill on this tree: bench/restart.sh, a cold start, then kills of the
# vocoder, the vocoder, the llm and the vocoder under the Poisson load of 10 a second.
#   bash docs/results/cover_2026-11-29/call4.sh
#
# Predicted (written 2026-11-29 23:14 UTC, before the call): a vocoder's kill that faults nothing: back in 12-13 s, the
# `say` probe 14-16 s; the llm's: ~16-17 s back, `say` 19-20 s (unchanged: nothing here touches it); a kill that
# faults the llm (3 of 12 vocoder kills so far): every GPU stage back in 17-19 s (20.1 s in call 3).
source bench/wheel_site.sh
STARTS=cold KILLS="vocoder vocoder llm vocoder" WAIT_GRAPHS=0 LAST_KILL=$((440 - SECONDS)) timeout $((585 - SECONDS)) bash bench/restart.sh
grep -c "run eagerly" "$OUT/up.log" | sed 's/^/lines "run eagerly" in up.log: /'
grep -E "died|as asked|starting it again" "$OUT/up.log" | cut -c1-200 | tail -20
(cd "$OUT" && tar czf call4.tgz restart up.log && rm -rf restart)
