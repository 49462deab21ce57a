#!/bin/bash
# Bursts of 96 at once on the embedded default (`moss-serve up`, a CPU): are the admitted turns stall-free with every
# torch stage taking every core (--cpu-threads 0) and with the cores shared out (the default)?
#
# Prediction (2026-11-30 11:33 UTC, before the run; ad hoc runs of the same bursts this morning, one process of each
# arm, 11 warm bursts each): with every core each, a chunk more than 20 ms late in 4 of 11 bursts (the second chunk,
# due 0.32 s after the first audio); shared, in none of the bursts that admitted 2 (the limit's start on 2 cores),
# and first audio ~0.1 s sooner. Bursts that the learned limit let 4 into stall in both arms.
#
# usage: bash docs/results/cpu_threads_2026-11-30/run.sh [BURSTS] [ARMS]   (default: 12 "0 share share 0")
set -euo pipefail
cd "$(dirname "$0")/../../.."
bursts=${1:-12}
arms=${2:-"0 share share 0"}
out=docs/results/cpu_threads_2026-11-30/runs
rm -rf "$out" && mkdir -p "$out"
round=0
for arm in $arms; do
  round=$((round + 1))
  flags=(); [ "$arm" = share ] || flags=(--cpu-threads "$arm")
  dir="$out/$round-$arm"; mkdir -p "$dir"
  .venv/bin/python -m services.cli up --no-encoder --gateway-port 47100 --gateway-metrics-port 47101 --llm-port 47102 \
    --llm-metrics-port 47103 --vocoder-port 47104 --vocoder-metrics-port 47105 --http-port 0 "${flags[@]}" \
    > "$dir/up.log" 2>&1 &
  up=$!
  until grep -q "Ctrl-C stops" "$dir/up.log"; do kill -0 $up; sleep 1; done
  for i in $(seq 0 "$bursts"); do  # burst 0: the processes' first turns (cold), not counted
    .venv/bin/python -m services.cli bench --no-progress --target 127.0.0.1:47100 --concurrency 96 --requests 96 \
      --max-new-tokens 40 --warmup 0 --out "$dir/$i" > /dev/null 2>&1
    sleep 1
  done
  kill -INT $up; wait $up || true
done
.venv/bin/python - "$out" <<'PY'
import glob, json, os, sys
from services.common.playback import JITTER_SECONDS, PlaybackClock
rows = {}
for d in sorted(glob.glob(f"{sys.argv[1]}/*-*")):
    arm = d.rsplit("-", 1)[1]
    r = rows.setdefault(arm, {"bursts": 0, "by_admitted": {}, "ttfa": [], "latest": []})
    for f in glob.glob(f"{d}/*/bench.json"):
        if f.split("/")[-2] == "0":
            continue
        streams = [s for s in json.load(open(f))["levels"]["96"]["streams"] if s["code"] == "OK"]
        r["bursts"] += 1
        late = []
        for s in streams:
            clock = PlaybackClock(s["sample_rate"])
            late.append(max(clock.arrive(t, n) for t, n in zip(s["chunk_arrivals_s"], s["chunk_samples"])))
            r["ttfa"].append(s["chunk_arrivals_s"][0])
        b = r["by_admitted"].setdefault(str(len(streams)), {"bursts": 0, "bursts_with_a_stall": 0, "streams": 0, "stalled": 0})
        b["bursts"] += 1; b["streams"] += len(streams)
        b["stalled"] += sum(x > JITTER_SECONDS for x in late); b["bursts_with_a_stall"] += any(x > JITTER_SECONDS for x in late)
        r["latest"].append(max(late))
print("| --cpu-threads | admitted a burst | bursts | with a stall | streams stalled | worst chunk late | TTFA p50 |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for arm, r in rows.items():
    t = sorted(r["ttfa"]); worst = max(r["latest"]) * 1000
    for n, b in sorted(r["by_admitted"].items()):
        print(f"| {arm} | {n} | {b['bursts']} | {b['bursts_with_a_stall']} | {b['stalled']} of {b['streams']} | "
              f"{worst:.0f} ms | {t[len(t) // 2] * 1000:.0f} ms |")
json.dump(rows, open(os.path.join(sys.argv[1], "summary.json"), "w"), indent=1)
PY
