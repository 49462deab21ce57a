#!/usr/bin/env bash
# Run 2026-11-30 05:59 UTC (written earlier that day): more rows of the fate-shared path (calls 8-9
# gave six, 14.2-19.2 s), with the vocoder's start now split in its log ("the flow moved to cuda in X s; the voices'
# prompt prefix, the stream history and the generator set up in Y s"), to find what the three concurrent starts
# contend for. Its probe column is bench/answer_probe.py's now (tries from one process, 0.2 s apart), not `moss-serve
# say`'s.
#   bash docs/results/flow_2026-11-30/next_call10.sh
#
# Predicted (written 2026-11-30 04:11 UTC, the probe's clause 05:18, before any run): every GPU stage back 14-17 s after
# a fault; the flow moved in under 0.5 s; Y 5-7 s beside the others (it is most of the 8.4-8.6 s "models" of call 9),
# ~2 s after a plain vocoder kill; the probe within 1 s of the load's next first audio.
source bench/wheel_site.sh
STARTS=cold KILLS="fault vocoder fault llm" WAIT_GRAPHS=0 LAST_KILL=$((440 - SECONDS)) timeout $((570 - SECONDS)) \
  bash bench/restart.sh
grep -E "died|from its spare|read ahead|moved to|loaded in|captured before|serving on" "$OUT/up.log" | cut -c1-170 | tail -40
(cd "$OUT" && tar czf call10.tgz restart up.log && rm -rf restart)
