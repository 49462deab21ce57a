#!/usr/bin/env bash
# The eager fallback in its last form (6f18e06: a call of a shape the warm-up missed is chosen before its inputs are
# padded, FlowGraphs.ready; the runner's bucket check first) on a GPU, which the previous entry ran only on the CPU: its two
# GPU tests, then the previous entry's call-6 stack again (--flow-history-streams 8: from the 9th stream on, window calls
# of shapes the warm-up did not capture; 64 streams started over 6 s; --max-turns 64 given, as `up` would otherwise cap
# the turns at the 8 slots).
# Then the llm's GPU tests (bench/gpu_smoke.sh tests-llm).
#   bash docs/results/eager_2026-11-28/call1.sh
#
# Predicted (written 2026-11-28 17:46 UTC, before the call; an H200): both tests pass; the stack logs flow calls run
# eagerly (>= 1 shape), no ERROR or CRITICAL line, no turn failed, the gateway's command
# with --max-turns 64; the admitted streams 20-50% stall-free (eager window calls are slow: call 6 of the previous entry,
# 30%). The llm's GPU tests all pass.
set -uo pipefail
OUT=${OUT:-/tmp/out}
(source bench/wheel_site.sh && python3 -m pytest -q -p no:cacheprovider tests/test_codec_stream.py tests/test_vocoder_stream.py \
  -k "eagerly" 2>&1 | tail -3)
(sleep 150; pgrep -af -- "--max-turns" | grep -v pgrep > "$OUT/max_turns_ps.txt") &
env OUT="$OUT/h8" ONLY=a RATES= LEVELS=64 BURST=0 timeout "${ARM_SECONDS:-220}" \
  bash bench/overload.sh --flow-history-streams 8 --max-turns 64 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -2
head -3 "$OUT/h8/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
echo "  run eagerly: $(grep -c 'run eagerly' "$OUT/h8/up.log" 2> /dev/null);" \
  "ERROR or CRITICAL lines: $(grep -cE ' (ERROR|CRITICAL) ' "$OUT/h8/up.log" 2> /dev/null)"
grep -m4 'run eagerly' "$OUT/h8/up.log"
echo "  the gateway's command: $(grep -o -- '--max-turns [0-9]*' "$OUT/max_turns_ps.txt" | sort | uniq -c | paste -sd' ')"
(cd "$OUT" && tar czf call1.tgz h8 max_turns_ps.txt && rm -rf h8)
bash bench/gpu_smoke.sh tests-llm
