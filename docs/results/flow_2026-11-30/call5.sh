#!/usr/bin/env bash
# Spares (services/spare.py): `moss-serve up` keeps a process per GPU stage that has done its imports and waits; a dead
# stage's restart is its spare's. up also looks at its services every 0.1 s (was 0.5 s). bench/restart.sh: a cold start,
# then SIGKILLs of the vocoder, the vocoder and the llm, 8 s into a Poisson load of 10 a second.
#   bash docs/results/flow_2026-11-30/call5.sh
#
# Call 3 again after its fixes (see call3.sh): spares that ask the driver whether cuInit ran; a stage refused its GPU
# under MPS, or one that lost it, exits 3 at once; up takes SIGABRT as a fault. Kills: vocoder, vocoder, llm.
#
# Predicted (written 2026-11-30 01:53 UTC, before the call), as for call 3: every restart is its spare's ("started
# again from its spare" in the log, no spare refused for the driver). A vocoder's kill that faults nothing: back 7-9 s after the kill
# (12.2-14.4 s without spares), the `say` probe 9-14 s (14.6-20.7 s); the llm's: back 10-12 s (15.6 s), `say` 12-14 s
# (17.6 s); a kill that faults the llm (a third of the vocoder's kills so far): every GPU stage back in 14-19 s (20.1-27.0).
source bench/wheel_site.sh
STARTS=cold KILLS="vocoder vocoder llm" WAIT_GRAPHS=0 LAST_KILL=$((330 - SECONDS)) timeout $((460 - SECONDS)) \
  bash bench/restart.sh
grep -c "run eagerly" "$OUT/up.log" | sed 's/^/lines "run eagerly" in up.log: /'
grep -E "died|as asked|starting it again|from its spare|spare for|spare exited" "$OUT/up.log" | cut -c1-200 | tail -24
(cd "$OUT" && tar czf call5.tgz restart up.log && rm -rf restart)
