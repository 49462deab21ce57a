#!/usr/bin/env bash
# Call 5 showed that CUDA's thread-local capture mode does not make a capture while serving safe: the capture's own
# device sync (and torch.cuda.graph's) failed beside the other worker's capture, a failed capture left its memory pool
# recording, and 18 ERROR lines and 6 failed turns followed. Now nothing is captured once the vocoder serves: a shape
# the warm-up missed runs eagerly (services/vocoder/codec/flow_graphs.py, runner.py), logged once. This call: the two
# GPU tests of it, then call 5's stack again (--flow-history-streams 8: from the 9th stream on, window calls of
# shapes the warm-up did not capture; 64 streams started over 6 s).
#   bash docs/results/ceiling_2026-11-28/call6.sh
#
# Predicted (written 2026-11-28 16:28 UTC, before the call; an H200): both tests pass; the stack logs flow calls
# run eagerly (>= 1 shape), no ERROR or CRITICAL line, no turn failed, the admitted turns >= 99% stall-free.
set -uo pipefail
OUT=${OUT:-/tmp/out}
(source bench/wheel_site.sh && python3 -m pytest -q -p no:cacheprovider tests/test_codec_stream.py tests/test_vocoder_stream.py \
  -k "eagerly" 2>&1 | tail -3)
env OUT="$OUT/h8" ONLY=a RATES= LEVELS=64 BURST=0 timeout "${ARM_SECONDS:-200}" \
  bash bench/overload.sh --flow-history-streams 8 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -2
head -3 "$OUT/h8/overload.txt" 2> /dev/null || echo "  (no report: the arm did not finish)"
echo "  run eagerly: $(grep -c 'run eagerly' "$OUT/h8/up.log" 2> /dev/null);" \
  "ERROR or CRITICAL lines: $(grep -cE ' (ERROR|CRITICAL) ' "$OUT/h8/up.log" 2> /dev/null)"
grep -m4 'run eagerly' "$OUT/h8/up.log"
(cd "$OUT" && tar czf call6.tgz h8 && rm -rf h8)
