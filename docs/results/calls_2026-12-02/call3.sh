#!/usr/bin/env bash
# Written 2026-12-02 ~01:20 UTC, before this run: the playing streams' vocoder calls at load, and whether shorter calls
# give a stream's second chunk its slack. Two stacks one after the other at the defaults (`moss-serve up --device cuda
# --preset moss-speech --kv-cache-gb 32 --max-num-seqs 256 --graphs-before-serving all`), each under Poisson 30 for 20 s
# and 256 started over 6 s on its own gateway (bench/overload.sh, ONLY=a: the vocoder's call histograms scraped after
# each load, the lane's apart): the defaults (calls of up to 32 windows, 4096 frames), then --max-batch-frames 1024.
#   bash docs/results/calls_2026-12-02/call3.sh   (third in order: after call1.sh and call2.sh, where device time is left)
#
# Predicted. Defaults, as on 2026-12-01: Poisson 30 ~400 of 600 admitted, 256 over 6 s ~138, the second chunk's slack
# p2 25-45 ms; the playing worker's calls 18-30 windows on average (a steady window ~103 frames: 80 new, 19 of HiFT's
# context, 4 of look-ahead), 100-135 ms each, the worker busy over 60% of the load.
# --max-batch-frames 1024 (~10 steady windows a call): playing calls 55-80 ms; the second chunk's vocoder part p50
# 180 → 100-130 ms; its slack p2 → 60-100 ms; admitted +10-30% (Poisson 30 440-520, the ramp 150-180), 100% stall-free;
# the later chunks' slack p2 falls (more, smaller calls: throughput ~2.5x the need, not ~4x) but stays over 300 ms;
# TTFA p95 within ±15 ms. Wrong if the worker falls behind (later chunks' slack collapsing, stalls), or if admitted
# does not move (then the second chunk's time is not the call's size).
# The other outcome, also possible: on 2026-11-28 the vocoder's two workers were 97% busy at Poisson 30 (calls of 8.3
# windows, 76 ms), so the playing worker may be near full. Then smaller calls (a call's fixed part ~34 ms beside the
# llm, ~2.6-3 ms a steady window: ~10 windows ~60 ms, ~170 s of audio a second against ~115 needed) leave it little
# room: the later chunks' slack falls toward the second's and the rule admits as many or fewer. Either way the
# defaults' histograms say how full the playing worker is, which decides the next step (a cap that applies only while
# an urgent chunk waits, or the flow's cost alone).
# Not run on 2026-12-02: that session's device time had been spent by an earlier try (none was left to start a machine).
set -uo pipefail
bash docs/results/calls_2026-12-02/stacks.sh "defaults:" "frames1024:--max-batch-frames 1024"
