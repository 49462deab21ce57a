#!/usr/bin/env bash
# Written 2026-12-02 ~17:37 UTC, before its run.
#   bash docs/results/calls_2026-12-02/call16.sh      (carry .whl, with .whl/inputs/question.flac)
#
# The issues' other loads at the defaults since the attention's small tile (call13 ran one stream, the ramp and Poisson
# 30): one spoken session, 128 spoken sessions over 6 s, Poisson 40 for 20 s, 128 at the same instant; three runs each.
# Predicted (against 2026-12-01's defaults, defaults_2026-12-01/call3.sh): one spoken session p50 76-90 ms from the end
# of speech (81.2); 128 spoken 108-120 admitted (112), 100% stall-free, p95 200-250 ms (209); Poisson 40 400-440 of 800
# (408); 128 at once all admitted, 100% stall-free in 2 or 3 runs of 3 (the third 96.9% then). A steady call alone is
# 2-8% faster: within these loads' spread.
set -uo pipefail
TAG=call16 RUNS=3 LOADS="spoken1 spoken p40 burst" timeout 585 bash docs/results/defaults_2026-12-01/loads.sh
