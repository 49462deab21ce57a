#!/usr/bin/env bash
# Run 2026-11-30 21:00-21:58 UTC on the 2-core development machine (no GPU), one loop at a time: tests/test_headroom.py's
# burst of 96 on the embedded default, a fresh stack each, 12 rounds; then each stream's lateness from its bench.json
# (chunk k due at first audio + the audio of chunks 0..k-1; a stall is > 20 ms late). The arms were the commit's code
# at a turn a core (CPU_TURNS_PER_CORE = 1 in services/up.py), the same with --max-starting-turns 1 given by up on a
# CPU, and a turn per two cores (CPU_CORES_PER_TURN = 2), edited in place between loops.
#   bash docs/results/cpu_bursts_2026-11-30/run.sh [rounds]
set -uo pipefail
rounds=${1:-12}
out=$(mktemp -d)
for i in $(seq 1 "$rounds"); do
  .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$out/$i" tests/test_headroom.py -k burst_of_96 \
    > "$out/$i.log" 2>&1
  echo "round $i: pytest rc $?"
done
for f in "$out"/*/test_a_burst_of_96*0/bench.json; do
  .venv/bin/python - "$f" <<'PY'
import json, sys
level = json.load(open(sys.argv[1]))["levels"]["96"]
for s in level["streams"]:
    if s["code"] != "OK":
        continue
    arrivals, samples, due, late = s["chunk_arrivals_s"], s["chunk_samples"], 0.0, []
    for k in range(1, len(arrivals)):
        due += samples[k - 1] / s["sample_rate"]
        late.append(arrivals[k] - (arrivals[0] + due))
    print(f"admitted {level['summary']['ok']}  TTFA {arrivals[0] * 1000:.0f} ms  latest chunk {max(late) * 1000:+.0f} ms")
PY
done
