#!/usr/bin/env bash
# Call 7 (H100): the llm against its floor and its peer after the attention and PDL changes (bench/gpu_smoke.sh
# bench), then the stack on the ramp of 256 streams started over 6 s (not measured since the flow's PDL).
set -uo pipefail
OUT=$OUT timeout 330 bash bench/gpu_smoke.sh bench 2>&1 | tail -30
OUT=$OUT/ramp ONLY=a RATES="" LEVELS=256 BURST=0 timeout 250 bash bench/overload.sh > $OUT/ramp.log 2>&1
tail -1 $OUT/ramp/overload.txt
grep -A4 "Mean stage" $OUT/ramp/a/*/bench.md 2>/dev/null | tail -1
(cd $OUT && tar czf ramp.tgz ramp && rm -rf ramp)
