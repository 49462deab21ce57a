#!/bin/bash
# With a core each (the default since run.sh): how many turns at once does the embedded default play on 2 cores, and
# does starting them 2 at a time (--max-starting-turns) let more play? Bursts of 96 under count admission, so that
# every burst admits exactly --max-turns.
#
# Prediction (2026-11-30 12:10 UTC, before the run): 3 at once stall in about half the bursts; 4 at once in most
# (5 of 7 bursts the learned limit let 4 into stalled, run.sh); 4 started 2 at a time stall less than 4 at once, the
# later two with first audio ~0.3 s later.
#
# usage: bash docs/results/cpu_threads_2026-11-30/starts.sh [BURSTS]   (default: 8)
set -euo pipefail
cd "$(dirname "$0")/../../.."
bursts=${1:-8}
out=docs/results/cpu_threads_2026-11-30/starts
rm -rf "$out" && mkdir -p "$out"
arms=("3 0" "4 0" "4 2")
for arm in "${arms[@]}"; do
  set -- $arm
  dir="$out/turns$1-starting$2"; mkdir -p "$dir"
  .venv/bin/python -m services.cli up --no-encoder --gateway-port 47100 --gateway-metrics-port 47101 --llm-port 47102 \
    --llm-metrics-port 47103 --vocoder-port 47104 --vocoder-metrics-port 47105 --http-port 0 \
    --admission count --max-turns "$1" --max-starting-turns "$2" --max-queued-turns 0 > "$dir/up.log" 2>&1 &
  up=$!
  until grep -q "Ctrl-C stops" "$dir/up.log" 2>/dev/null; do kill -0 $up; sleep 1; done
  for i in $(seq 0 "$bursts"); do  # burst 0: the processes' first turns (cold), not counted
    .venv/bin/python -m services.cli bench --no-progress --target 127.0.0.1:47100 --concurrency 96 --requests 96 \
      --max-new-tokens 40 --warmup 0 --out "$dir/$i" > /dev/null 2>&1
    rm -f "$dir/$i"/*.png "$dir/$i"/bench.md
    sleep 1
  done
  kill -INT $up; wait $up || true
done
.venv/bin/python - "$out" <<'PY'
import glob, json, sys
from services.common.playback import JITTER_SECONDS, PlaybackClock
print("| arm | bursts | with a stall | streams stalled | second chunk early: min / median | TTFA p50 / max |")
print("| --- | --- | --- | --- | --- | --- |")
for d in sorted(glob.glob(f"{sys.argv[1]}/turns*")):
    bursts = stalled_bursts = stalled = n = 0; second = []; ttfa = []
    for f in glob.glob(f"{d}/*/bench.json"):
        if f.split("/")[-2] == "0":
            continue
        streams = [s for s in json.load(open(f))["levels"]["96"]["streams"] if s["code"] == "OK"]
        bursts += 1; n += len(streams); late_any = False
        for s in streams:
            clock = PlaybackClock(s["sample_rate"])
            late = [clock.arrive(t, k) for t, k in zip(s["chunk_arrivals_s"], s["chunk_samples"])]
            second.append(-late[1] * 1000); ttfa.append(s["chunk_arrivals_s"][0] * 1000)
            stalled += max(late) > JITTER_SECONDS; late_any |= max(late) > JITTER_SECONDS
        stalled_bursts += late_any
    second.sort(); ttfa.sort()
    print(f"| {d.rsplit('/', 1)[1]} | {bursts} | {stalled_bursts} | {stalled} of {n} | {second[0]:.0f} / "
          f"{second[len(second) // 2]:.0f} ms | {ttfa[len(ttfa) // 2]:.0f} / {ttfa[-1]:.0f} ms |")
PY
