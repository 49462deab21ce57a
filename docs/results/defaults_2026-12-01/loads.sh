#!/usr/bin/env bash
# The issue's loads on one stack at the defaults (`moss-serve up --device cuda --preset moss-speech --kv-cache-gb 32
# --max-num-seqs 256`, the llm's share following the load), each run RUNS times on the one gateway, judged by
# `moss-serve bench` from outside: LOADS, in order, of
#   one      one stream at a time, 12 turns of 2-4 s (TTFA)
#   ramp     256 started over 6 s, replies of 2-20 s
#   p30/p40  Poisson 30 or 40 a second for 20 s, replies of 2-20 s
#   p30long  Poisson 30 a second for 60 s, replies of 2-20 s (a sustained overload; added 2026-12-02)
#   burst    128 at the same instant on the idle stack, replies of 2-20 s
#   spoken1  one spoken session, 4 x 2 turns (.whl/inputs/question.flac, 5.1 s of espeak-ng)
#   spoken   128 spoken sessions started over 6 s, one turn each, replies of 2-20 s
# Each run's first table row and its second and third chunks' slack printed (COPY_MD=1: its bench.md to $OUT too);
# every run's bench.md and bench.json packed in $OUT/<tag>_results.tgz at the end
# (the device tool brings back at most 8 files). EXTRA: flags after the defaults' (added 2026-12-02; none before).
#   TAG=call2 RUNS=3 LOADS="one ramp p30" bash docs/results/defaults_2026-12-01/loads.sh
set -uo pipefail
source bench/stack.sh
IN=$PWD/.whl/inputs
tag=${TAG:-run}; runs=${RUNS:-3}
b() { timeout 150 python3 -c "$SERVE_PY" bench --no-progress --timeout 180 "$@" 2>&1 | tail -1; }
# shellcheck disable=SC2086  # (EXTRA: words)
if start_stack --kv-cache-gb 32 --max-num-seqs 256 --graphs-before-serving all ${EXTRA:-}; then
  grep -E "steps take the whole GPU|keep [0-9]+% of the GPU|llm: its steps|encoder: .*places" "$OUT/up.log" | head -4 | cut -c1-250
  for load in ${LOADS:-one}; do
    n=$runs; [ "$load" = one ] || [ "$load" = spoken1 ] && n=1
    for k in $(seq 1 "$n"); do
      d=$WORK/res/${load}$k
      mkdir -p "$d" && scrape 9093 "$d/metrics_vocoder_before.txt"  # (added 2026-12-02: the vocoder's calls by windows)
      case $load in
        one) b --reply-seconds 2-4 --concurrency 1 --requests 12 --warmup 2 --out "$d" ;;
        ramp) b --reply-seconds 2-20 --concurrency 256 --requests 256 --ramp 6 --warmup 0 --out "$d" ;;
        p30) b --reply-seconds 2-20 --rate 30 --seconds 20 --warmup 0 --out "$d" ;;
        p40) b --reply-seconds 2-20 --rate 40 --seconds 20 --warmup 0 --out "$d" ;;
        p30long) timeout 240 python3 -c "$SERVE_PY" bench --no-progress --timeout 180 --reply-seconds 2-20 --rate 30 \
                   --seconds 60 --warmup 0 --out "$d" 2>&1 | tail -1 ;;
        burst) sleep 3; b --reply-seconds 2-20 --concurrency 128 --requests 128 --warmup 0 --out "$d" ;;
        spoken1) b --speech "$IN/question.flac" --concurrency 1 --requests 4 --turns 2 --max-new-tokens 25 --warmup 1 --out "$d" ;;
        spoken) b --speech "$IN/question.flac" --concurrency 128 --ramp 6 --requests 128 --turns 1 \
                  --reply-seconds 2-20 --warmup 0 --out "$d" ;;
      esac
      [ -f "$d/bench.md" ] && echo "$load $k: $(grep -m1 -E '^\| (rate |)[0-9]+' "$d/bench.md")" \
        && grep -E '^\| [^|]+ \| (2nd|3rd) \|' "$d/bench.md"
      scrape 9093 "$d/metrics_vocoder_after.txt"
      [ "${COPY_MD:-0}" = 1 ] && cp "$d/bench.md" "$OUT/${tag}_${load}$k.md"
      sleep 2
    done
  done
  scrape 9092 "$WORK/res/llm_metrics.txt"; grep "^llm_gpu_place_steps_total" "$WORK/res/llm_metrics.txt"
  stop_stack
fi
(cd "$WORK" && tar czf "$OUT/${tag}_results.tgz" res)
gzip -c "$OUT/up.log" > "$OUT/${tag}_up.log.gz"; rm -f "$OUT/up.log"
