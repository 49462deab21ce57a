#!/usr/bin/env bash
# Written 2026-12-01 ~10:50 UTC, before this run. Calls 2-3 found the headroom limit falling on the playing streams'
# slack (p2 under 50 ms: "admission limit 48 -> 36 turns (the latest fall: slack p2 46 ms)") while TTFA p95 stayed at
# 221-245 ms, under the rule's 280. By the streams' chunks at the client (slack_by_chunk.py over call 2's bench.json):
# every chunk under 50 ms of slack was a stream's second, which its listener waits for with only the first chunk's
# 320 ms of audio (p2 31-34 ms; the third chunk's p2 278-319 ms, later ones more). The second chunk waits in the
# playing streams' worker for its call in flight (~75 ms) and then its own. This tree runs it on the first-chunk lane
# (--lane-chunks 2, the new default), earliest deadline first with the first chunks there.
#   bash docs/results/defaults_2026-12-01/call4.sh
#
# Predicted: the second chunk's slack p2 31-34 → 70-110 ms (its wait for the playing worker's call gone, ~40 ms mean);
# the lowest chunks' slack then the third's or the second's near 80-100 ms, so the limit falls on TTFA instead; TTFA
# p95 230-245 → 240-270 ms (first chunks share the lane with second ones: its wait 15 → 25-35 ms); admitted: ramp
# 132-141 → 150-190, Poisson 30 397-402 → 430-520 of ~600; every admitted stream stall-free (99.5-100%). If the
# second chunk's slack does not move, or admitted falls (the 2026-11-27 H100 try of the same, without deadline order
# in the lane: 289 → 261, 98.5% stall-free), the default goes back to 1.
set -uo pipefail
TAG=call4 RUNS=2 LOADS="one ramp p30" timeout 585 bash docs/results/defaults_2026-12-01/loads.sh
