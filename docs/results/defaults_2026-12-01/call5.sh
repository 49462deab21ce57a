#!/usr/bin/env bash
# Written 2026-12-01 ~10:47 UTC, before this run: where a stream's second chunk spends its time under load, now that
# the gateway's summary carries its parts (7365f76): the llm's second token chunk after its first, the vocoder's time
# for it (tokens in → audio ready) and its wait for a call there. One run each of 256 over 6 s and Poisson 30 (the
# session's device time left: ~290 s).
#   bash docs/results/defaults_2026-12-01/call5.sh
#
# Predicted: at Poisson 30 the llm's part 55-65 ms (5 steps of ~11.7 ms, call 2's), the vocoder's 110-150 ms (its
# wait for the playing worker's call in flight 35-70 ms, its call ~75 ms), the slack's p50 120-140 ms and p2 25-45
# ms as in calls 2-3; the vocoder's part the larger one, and its wait the part that varies.
set -uo pipefail
TAG=call5 RUNS=1 COPY_MD=1 LOADS="ramp p30" timeout 280 bash docs/results/defaults_2026-12-01/loads.sh
