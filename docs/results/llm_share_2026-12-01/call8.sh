#!/usr/bin/env bash
# Written 2026-12-01 ~06:37 UTC, before this run: the other loads with the llm's share following the load
# (the new default) and with 25% for every step, one stack each: Poisson 30 a second for 20 s, then 128 at the same
# instant on the idle stack.
#   bash docs/results/llm_share_2026-12-01/call8.sh
#
# Predicted: Poisson 30 admitted within the spread of the fixed share's runs (384-432 of 600 on 2026-11-28/29) in
# both, 99-100% stall-free; the burst 128 of 128 admitted in both, 93.8-100% stall-free (its record: 9 of 10 bursts
# stall-free); with the share following the load nearly every step of both loads on the share (more than 2 running).
set -uo pipefail
ARM=on N=8 REQUESTS=0 LOADS="poisson burst" timeout 270 bash docs/results/llm_share_2026-12-01/arm.sh
ARM=off N=8 REQUESTS=0 LOADS="poisson burst" timeout 270 bash docs/results/llm_share_2026-12-01/arm.sh
