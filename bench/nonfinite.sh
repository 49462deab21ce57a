#!/usr/bin/env bash
# Where the vocoder's NaN samples come from, in one device call (docs/benchmarks.md, 2026-11-28):
#   1. the first-chunk lane's allocator hazard with streamer.used_here and without it (bench/lane_hazard.py: seconds);
#   2. the real-size vocoder alone as `moss-serve up` runs it (--first-chunk-lane on), its NaN counters and streams
#      compared with themselves played alone (bench/vocoder_finite.py --alone), on this tree;
#   3. the same on a copy of the tree whose streamer.used_here does nothing (the hazard left in, as before 2026-11-28)
#      (BEFORE=0: not run).
#   bash bench/nonfinite.sh            # OUT (default /tmp/out) gets the JSON and the vocoders' logs
# STREAMS (default 200), CONCURRENCY (48), ALONE (20) go to vocoder_finite.py.
source "$(dirname "$0")/wheel_site.sh"
finite() {  # $1: the tree; $2: the name of its results
  (cd "$1" && PYTHONPATH=$SITE:$1:$1/protos python3 bench/vocoder_finite.py --device cuda --preset moss-speech \
    --streams "${STREAMS:-200}" --concurrency "${CONCURRENCY:-48}" --alone "${ALONE:-20}" \
    --variant "$2=--first-chunk-lane on" --log-dir "$OUT/$2" --json "$OUT/finite_$2.json") 2>&1 | tail -8
}
echo "== 1. the lane's allocator hazard"
python3 bench/lane_hazard.py --trials 20 --json "$OUT/lane_hazard.json" 2>&1 | tail -8
echo "== 2. the vocoder alone, this tree"
finite "$PWD" now
if [[ ${BEFORE:-1} != 0 ]]; then
  echo "== 3. the vocoder alone, streamer.used_here doing nothing"
  rm -rf /tmp/before && cp -r "$PWD" /tmp/before
  python3 - /tmp/before/services/vocoder/streamer.py <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
body = "    for t in tensors:\n        if isinstance(t, torch.Tensor) and t.is_cuda:"
assert body in text, "streamer.used_here is not as this script knows it"
open(path, "w").write(text.replace(body, "    return  # (bench/nonfinite.sh: the hazard left in)\n" + body, 1))
EOF
  finite /tmp/before before
fi
