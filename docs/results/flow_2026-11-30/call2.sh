#!/usr/bin/env bash
# After call 1 (its codec_history beside the llm failed: the llm child exited 1, its error lost to `tail`):
#   1. bench/rolling.sh on the GPU for the first time: two replicas on one H200 (--replicas 2 --kv-cache-gb 16
#      --max-num-seqs 128), a Poisson load of 5 a second for 90 s (replies of 2-20 s), SIGHUP to `up` 10 s in;
#   2. bench/codec_history.py --beside-llm again, its whole log kept ($OUT/codec_history.log).
#   bash docs/results/flow_2026-11-30/call2.sh
#
# Predicted (written 2026-11-30 01:27 UTC, before the call): 1. the round takes 50-80 s (each replica drains for up to
# ~20 s, the length of its longest reply, then is back in 12-16 s); 0 admitted turns fail in every group; refusals
# during the round (one replica's capacity), none before; admitted stall-free >= 95%. 2. alone: a first call ~22 ms,
# 32 streams steady ~60 ms; beside the llm 1.5-2.5x those; the llm's step 9-12 ms beside (6.4 alone).
source bench/wheel_site.sh
RATE=5 LOAD_SECONDS=90 HUP_AFTER=10 timeout 400 bash bench/rolling.sh 2>&1 | tail -22
(cd "$OUT" && tar czf call2.tgz up.log rolling_load.log rolling 2>/dev/null && rm -rf rolling)
timeout $((585 - SECONDS)) python3 bench/codec_history.py --streams 1,32 --modes history --beside-llm \
  --json "$OUT/codec_history.json" > "$OUT/codec_history.log" 2>&1
echo "codec_history exit $?"
grep -nE "Error|Traceback|error:|raise |Exit|Killed" "$OUT/codec_history.log" | head -12
tail -8 "$OUT/codec_history.log"
