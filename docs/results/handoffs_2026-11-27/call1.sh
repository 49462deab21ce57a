#!/usr/bin/env bash
# Call 1: the llm's floor and peer (owed since the mixed step), then the stack at Poisson 30 with py-spy sampling the
# gateway, the llm and the vocoder (on-CPU stacks, not stopping them) for 15 s in the middle of the load.
set -uo pipefail
OUT=${OUT:-/tmp/out}
timeout 280 bash bench/gpu_smoke.sh bench 2>&1 | tail -30
SITE=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/py_spy-*.whl
spy() {  # wait for the load's timeline, then 15 s of samples from each service
  for _ in $(seq 1 200); do [ -f "$OUT/x/a/timeline.tsv" ] && break; sleep 1; done
  sleep 7
  for svc in gateway llm vocoder; do
    pid=$(pgrep -f "services.cli $svc " | head -1)
    [ -n "$pid" ] && "$SITE/bin/py-spy" record --pid "$pid" --duration 15 --rate 200 --nonblocking --threads \
      --format raw -o "$OUT/spy_$svc.txt" > "$OUT/spy_$svc.log" 2>&1 &
  done
  wait
}
spy &
OUT=$OUT/x ONLY=a RATES=30 LEVELS="" BURST=0 timeout 290 bash bench/overload.sh 2>&1 | tail -40
wait
ls -la "$OUT"; for f in "$OUT"/spy_*.log; do echo "== $f"; tail -3 "$f"; done
