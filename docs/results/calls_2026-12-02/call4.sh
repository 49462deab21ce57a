#!/usr/bin/env bash
# Written 2026-12-02 ~03:10 UTC, after call1 and before this run: urgent calls with the limit grown in proportion to
# TTFA's room (--admit-growth 0.4), the urgent threshold at 0.4 s (second chunks) and at 0.6 s (third chunks too).
#   bash docs/results/calls_2026-12-02/call4.sh
#
# Why (call1, read from each load's bench.json: the turns running at each refusal): with --urgent-seconds 0.4 the limit
# never fell in 20 s of Poisson 30; it climbed at the rule's +2 a half second from 48 to 104 (the defaults' fell to 41-43
# on slack p2 44 ms and TTFA p95 288 ms). Its turns last longer (sent to last chunk p50 3.29 s against 2.14 s: the later
# chunks wait for the urgent ones, still 0.76 s ahead of the listener at p2), so 104 running serve ~30 turns/s against
# the defaults' ~43 running, ~20/s. Admitted 368 against 399 there: bound by the limit's growth, not by the stack. The
# ramp after it (limit carried at ~106) stalled 4 of 146 (second chunk slack p2 -21 ms): ~100 running is the edge.
# Predicted, each under Poisson 30 (20 s) then 256 started over 6 s, on its own gateway:
#   urgent04g: the limit reaches ~90-100 within ~5 s; Poisson 30 480-580 of 600, 99-100% stall-free, TTFA p95 within
#     ±20 ms of call1's 214 ms; the ramp 130-160 of 256 (the limit falls on slack when it overshoots), 98-100% stall-free.
#   urgent06g: third chunks urgent too (they reach the vocoder with ~0.5 s): the third chunk's slack p2 on the ramp 73 →
#     150-250 ms, the second chunk's a little lower than urgent04g's (more jobs share the urgent calls); admitted within
#     ±5% of urgent04g.
# Wrong if the growth overshoots into stalls (<99% stall-free at Poisson 30) or if the limit still climbs at +2.
set -uo pipefail
bash docs/results/calls_2026-12-02/stacks.sh "urgent04g:--urgent-seconds 0.4 --admit-growth 0.4" \
  "urgent06g:--urgent-seconds 0.6 --admit-growth 0.4"
