#!/usr/bin/env bash
# Run 2026-11-30 (session 2): the fate-shared restart again after call 6, with three changes: a stage whose GPU failed
# waits 0.5 s for its running calls, not 5 s (the vocoder's 5 s held every restart back in call 6); two spares per stage
# (call 6's vocoder kill faulted the server, its spare was refused, and its restart waited 4.3 s for the next spare's
# imports); a fault timed from its illegal store (bench/gpu_fault.py prints it; call 6 timed it from that process's
# start, ~5 s earlier). Every line of up's own log now carries its time.
#   bash docs/results/flow_2026-11-30/call8.sh
#
# Predicted (written 2026-11-30 03:31 UTC, before the call): a fault: every GPU stage stopped within 1 s of it, the llm
# serving ~12 s after, the vocoder ~17 s (its spare's models 9-11 s beside the others' loads, 28 graphs ~5 s): back
# 16-19 s, `say` 17-20 s (call 6: 27.6 s from the fault process's start, ~22.5 s from the store). A vocoder's kill
# 10-11 s back if it faults nothing, 16-19 s if it does; the llm's 8-12 s.
source bench/wheel_site.sh
STARTS=cold KILLS="fault vocoder fault llm" WAIT_GRAPHS=0 LAST_KILL=$((420 - SECONDS)) timeout $((560 - SECONDS)) \
  bash bench/restart.sh
grep -E "died|as asked|starting it again|from its spare|spares? (for|exited)|faulted|stopping$|stopped$" "$OUT/up.log" \
  | cut -c1-170 | tail -40
(cd "$OUT" && tar czf call8.tgz restart up.log && rm -rf restart)
