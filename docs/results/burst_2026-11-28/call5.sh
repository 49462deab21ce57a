#!/usr/bin/env bash
# More runs of the burst under the rule, for the stall rate of 128 at once (call 4 had a burst of sessions at 93.8%,
# three other bursts 100%), with the stages' busy counters sampled every 0.5 s (bench/timeline.py) so that the next
# stop can see what the stages did in a burst's first seconds: one stack at its defaults, 128 plain turns at the same
# instant twice, then 128 two-turn sessions (as call 4), replies of 2-20 s.
#   bash docs/results/burst_2026-11-28/call5.sh
#
# Predicted (written 2026-11-28 14:40 UTC, before the call; an H200): each burst 128 of 128 first turns admitted,
# 93-100% stall-free (any stall a second chunk of the burst's middle waves, 1-2 s in); the sessions' second turns 0-20
# refused with a hint.
set -uo pipefail
source bench/stack.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
common=(--target 127.0.0.1:50051 --reply-seconds 2-20 --no-progress --timeout 180 --warmup 0 --concurrency 128 --requests 128)
if start_stack --kv-cache-gb 32 --max-num-seqs 256; then
  python3 bench/timeline.py "$OUT/timeline.tsv" 9091 9092 9093 &
  sampler=$!
  seed=1
  for run in burst_a burst_b; do
    serve bench "${common[@]}" --seed $seed --out "$OUT/$run" > "$OUT/$run.txt" 2>&1
    seed=$((seed + 1))
  done
  serve bench "${common[@]}" --turns 2 --turn-gap 0.5 --out "$OUT/sessions" > "$OUT/sessions.txt" 2>&1
  grep -h -A1 "stall-free" "$OUT"/*.txt | grep -v "^--" | head -12
  kill "$sampler"
  scrape 9091 "$OUT/metrics_gateway.txt"
  grep -E "^gateway_(burst_admissions_total|headroom_refusals_total|admission_limit) " "$OUT/metrics_gateway.txt" | paste -sd' '
fi
stop_stack
python3 - "$OUT" <<'PY'
import json, sys, pathlib
sys.path[:0] = ["."]
from services.bench.stream import StreamRecord
for run in ("burst_a", "burst_b", "sessions"):
    path = pathlib.Path(sys.argv[1]) / run / "bench.json"
    if not path.exists():
        print(run, "no bench.json"); continue
    for level in json.loads(path.read_text())["levels"].values():
        first = [x for x in level["streams"] if x["turn"] in (0, 1)]
        late = []
        for x in first:
            r = StreamRecord(sent=0.0, code=x["code"], sample_rate=x["sample_rate"],
                             chunks=list(zip(x["chunk_arrivals_s"], x["chunk_samples"])))
            if r.ok and r.stalls():
                k = next(i for i, v in enumerate(r.lateness()) if v > 0)
                late.append((round(r.ttfa, 2), k, round(max(r.stalls()), 3)))
        ok = sum(1 for x in first if x["code"] == "OK")
        print(f"{run}: first turns {ok} ok, {ok - len(late)} stall-free; stalled (TTFA, first late chunk, worst s): {late}")
PY
(cd "$OUT" && tar czf "$WORK/call5.tgz" . && find . -mindepth 1 -delete && mv "$WORK/call5.tgz" .)
# Call 5 (H200, 187 s; call5.tgz): the two plain bursts 128 of 128, 100% stall-free, TTFA p50 / p95 1282 / 2496 and
# 1172 / 2291 ms; the sessions' first turns 128 of 128, 100% stall-free, 1084 / 2144 ms; their second turns 113 ran,
# 100%, 171 / 226 ms, and 15 were refused with a hint (as in call 4). In range.
