#!/usr/bin/env bash
# Written 2026-12-02 ~01:40 UTC, before this run: urgent calls in the playing streams' worker (--urgent-seconds, worker.py).
# Two stacks one after the other at the defaults (`moss-serve up --device cuda --preset moss-speech --kv-cache-gb 32
# --max-num-seqs 256 --graphs-before-serving all`), each under Poisson 30 for 20 s and 256 started over 6 s on its own
# gateway (bench/overload.sh, ONLY=a: the vocoder's call histograms scraped after each load, the lane's apart, the
# flow's and the generator's device time): the defaults, then --urgent-seconds 0.4.
#   bash docs/results/calls_2026-12-02/call1.sh
#
# Why (docs/benchmarks.md, ci-2026-12-02, from 2026-12-01's call 5): at 40-50 turns running a stream's second chunk
# spent 187 ms in the vocoder at the median: 58 ms waiting for the call in flight, then 131 ms in its own call, which it
# shares with the playing streams' later chunks (they have seconds to spare: the llm makes them ~5x faster than real
# time). Under 30 turns running the same parts were 20 and 81 ms. A second chunk comes to the vocoder with ~0.3 s of
# slack, a third with ~0.5 s, later ones with seconds: 0.4 s takes the second chunks (and late ones) alone.
# Predicted, --urgent-seconds 0.4 against the defaults: the second chunk's own call 131 → 45-70 ms, its wait 58 → 45-75
# ms (the calls in flight now alternate: short urgent ones, longer ones of later chunks), its time in the vocoder p50
# 187 → 100-140 ms; at the same turns running its slack p2 +40-70 ms; the playing worker's calls +50-100% in number,
# fewer windows each; the third chunk's slack p2 279 → 150-250 ms. If the worker keeps up (the later chunks' slack
# stays over ~0.5 s), the limit settles higher and more are admitted: Poisson 30 440-540 against ~400, the ramp 150-190
# against ~138, 100% stall-free, TTFA p95 within ±15 ms. Wrong if the extra calls' fixed cost leaves the worker behind:
# the later chunks' slack collapsing, the rule falling on them, as many or fewer admitted.
set -uo pipefail
bash docs/results/calls_2026-12-02/stacks.sh "defaults:" "urgent04:--urgent-seconds 0.4"
