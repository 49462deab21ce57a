#!/usr/bin/env bash
# Each stage's work half second by half second (bench/timeline.py, new in the previous entry), at the defaults and with the
# opt-in trades (--flow-steps 5 --quantization fp8), issue 23. Each arm is a stack of its own (moss-serve up at its
# defaults plus the arm's flags: MPS with the llm at 25%, random weights, the codec's decoder), one gateway, loaded by
# the outside client at Poisson 30/s for 20 s, then 256 streams started over 6 s (replies of 2-20 s); the arms in
# ARMS' order on one machine.
#   [ARMS="defaults trades"] bash docs/results/timeline_2026-11-28/call.sh
#
# The question: when the rule refuses, are both stages busy? If, in the half seconds of a load, the llm and the vocoder
# are both >= 80% busy most of the time, the knee is the GPU's work per second of audio (what the issue's "find and
# remove the ceiling" has been about since 2026-11-26) and the rule refuses what the stages cannot carry. If refusals
# come while a stage idles, the rule is what holds the count, and its knobs are the lever.
#
# Predicted (written 2026-11-28 10:44 UTC, before the call; the machine lent is an H200, whose runs of the defaults
# gave 398-411 of 600 and 134-143 of 256):
# - defaults: Poisson 30 380-420 of 600 admitted, >= 99% stall-free, TTFA p95 260-285 ms; the ramp 125-145 of 256.
#   Half seconds of the Poisson load: the llm >= 80% busy in 55-75%, the vocoder (its two workers: up to 200%) in
#   70-90%, both in 45-65%. The ramp's ~24 s: llm 25-40%, vocoder 35-50%, both 20-35%, in its first ~10 s.
# - trades: Poisson 30 570-600, TTFA p95 200-240 ms; the ramp 195-225. Half seconds of the Poisson load: fewer busy
#   than the defaults (llm 45-65%, vocoder 45-70%): the rule's limit, not the stages, holds some of the refused at
#   this rate; the ramp's first ~8 s both busy, as at the defaults.
set -uo pipefail
OUT=${OUT:-/tmp/out}
for arm in ${ARMS:-defaults trades}; do
  case $arm in defaults) flags=() ;; trades) flags=(--flow-steps 5 --quantization fp8) ;; *) echo "unknown arm $arm"; exit 2 ;; esac
  echo "=== arm $arm: moss-serve up ${flags[*]}"
  OUT=$OUT/$arm ONLY=a RATES=30 LEVELS=256 BURST=0 timeout "${ARM_SECONDS:-290}" bash bench/overload.sh "${flags[@]}" 2>&1 \
    | grep -vE "^\s*$|it/s|%\|" | tail -3
  cat "$OUT/$arm/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
  echo "  captured while serving: $(grep -c "captured while serving" "$OUT/$arm/up.log" 2> /dev/null)"
  echo "  invalid value: $(grep -c "invalid value" "$OUT/$arm/up.log" 2> /dev/null)"
done
# Call 1 (H200, 372 s): defaults 412 of 600 (100% stall-free, TTFA p95 274 ms), the ramp 147 of 256 (100%, 280 ms);
# trades 573 (100%, 184 ms) and 212 (100%, 217 ms). Half seconds both busy: 54% of the Poisson load's 39 s, 27% of the
# ramp's 24.5 s, the same share for each stage alone (loaded, both stages are busy; after the arrivals, neither).
# Call 2 (written before it): `bash bench/wheels.sh --parity; bash bench/gpu_smoke.sh tests-codec` (.whl 18 MB:
# silero-vad and py-spy left out) on this tree, whose vocoder has not had its GPU tests since --flow-solve lane was
# taken out (9fba4c9). Predicted: every codec GPU test passes (~290, parity among them), in ~280 s.
