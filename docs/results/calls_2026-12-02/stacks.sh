#!/usr/bin/env bash
# One stack after another, each under Poisson 30 for 20 s and 256 started over 6 s on its own gateway (bench/overload.sh,
# ONLY=a), at the defaults (`moss-serve up --device cuda --preset moss-speech --kv-cache-gb 32 --max-num-seqs 256
# --graphs-before-serving all`) plus each variant's flags; per variant the first table row and the second, third and
# later chunks' slack of each load printed, and everything packed in $OUT/<name>.tgz (the device tool brings back few
# files). call1.sh and call3.sh run it.
#   bash docs/results/calls_2026-12-02/stacks.sh "name:flags" ...      (e.g. "defaults:" "urgent04:--urgent-seconds 0.4")
set -uo pipefail
base=${OUT:-/tmp/out}
for variant in "$@"; do
  name=${variant%%:*} flags=${variant#*:}
  echo "=== $name: ${flags:-(the defaults)}"
  # shellcheck disable=SC2086  # (flags: words)
  OUT=$base/$name ONLY=a RATES=30 LEVELS=256 BURST=0 \
    STACK_FLAGS="--kv-cache-gb 32 --max-num-seqs 256 --graphs-before-serving all" timeout 285 bash bench/overload.sh $flags
  mkdir -p "$base/$name/md" && tar xzf "$base/$name/results.tgz" -C "$base/$name/md" --wildcards '*bench.md' 2> /dev/null
  for f in "$base/$name"/md/*/*/bench.md; do  # (pack_results took them into results.tgz)
    echo "$f: $(grep -m1 -E '^\| (rate |)[0-9]+' "$f")"; grep -E '^\| [^|]+ \| (2nd|3rd|later) \|' "$f"
  done 2> /dev/null
  rm -rf "$base/$name/md"
  (cd "$base" && tar czf "$name.tgz" "$name" && rm -rf "$name")
done
