#!/usr/bin/env bash
# Spares (services/spare.py): `moss-serve up` keeps a process per GPU stage that has done its imports and waits; a dead
# stage's restart is its spare's. up also looks at its services every 0.1 s (was 0.5 s). bench/restart.sh: a cold start,
# then SIGKILLs of the vocoder, the vocoder, the llm and the vocoder, 8 s into a Poisson load of 10 a second.
#   bash docs/results/flow_2026-11-30/call3.sh
#
# Ran at 01:42: every spare refused itself (libcuda.so was mapped after torch's import: the check was too strict), and
# the llm's kill faulted the vocoder, which aborted (-6) where it meant to exit 3; the encoder kept the faulted MPS
# server, which refused the llm and the vocoder at every restart (exit 2) for 2.5 minutes. Call 5 runs the same bench
# after the fixes (spare.py asks the driver whether cuInit ran; cli.py exits 3 without teardown, and a stage refused
# its GPU under MPS exits 3; up's MpsKeeper takes SIGABRT as a fault).
#
# Predicted (written 2026-11-30 01:41 UTC, before the call): every restart is its spare's ("started again from its
# spare" in the log, no spare refused for the driver). A vocoder's kill that faults nothing: back 7-9 s after the kill
# (12.2-14.4 s without spares), the `say` probe 9-14 s (14.6-20.7 s); the llm's: back 10-12 s (15.6 s), `say` 12-14 s
# (17.6 s); a kill that faults the llm (a third of the vocoder's kills so far): every GPU stage back in 14-19 s (20.1-27.0).
source bench/wheel_site.sh
STARTS=cold KILLS="vocoder vocoder llm vocoder" WAIT_GRAPHS=0 LAST_KILL=$((400 - SECONDS)) timeout $((520 - SECONDS)) \
  bash bench/restart.sh
grep -c "run eagerly" "$OUT/up.log" | sed 's/^/lines "run eagerly" in up.log: /'
grep -E "died|as asked|starting it again|from its spare|spare for|spare exited" "$OUT/up.log" | cut -c1-200 | tail -24
(cd "$OUT" && tar czf call3.tgz restart up.log && rm -rf restart)
