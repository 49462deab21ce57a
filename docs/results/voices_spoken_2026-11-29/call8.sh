#!/usr/bin/env bash
# After call 7: the encoder's speakers' audio waits up to 40 ms for company (worker.py FEED_WAIT_SECONDS; 2 ms
# before), so that its calls are fewer and fuller and leave the GPU to the llm and the vocoder (an end of turn never
# waits). The stack at the defaults, once its graphs are captured (at most 70 s of waiting), then 128 spoken sessions
# started over 6 s, as call 3.
#   bash docs/results/voices_spoken_2026-11-29/call8.sh
# Predicted (2026-11-29 20:41 UTC): the encoder's calls 4 speakers on average -> 20-40; admitted 95 -> 100-120 of 128;
# end of speech -> first audio p95 298 -> 260-290 ms; the encoder's finish ~19 ms as in call 3.
set -uo pipefail
source bench/stack.sh
IN=$PWD/.whl/inputs
if start_stack --kv-cache-gb 32 --max-num-seqs 256; then
  for _ in $(seq 1 140); do grep -q "every CUDA graph captured" "$OUT/up.log" && break; sleep 0.5; done
  grep -E "every CUDA graph captured" "$OUT/up.log" | cut -c1-160
  scrape 9094 "$OUT/encoder_before.txt"
  serve bench --speech "$IN/question.flac" --concurrency 128 --ramp 6 --requests 128 --turns 1 \
    --reply-seconds 2-20 --warmup 0 --no-progress --out "$OUT/spoken128" 2>&1 | grep -E "^ *128" | head -3
  scrape 9094 "$OUT/encoder_after.txt"
  grep -E "^encoder_batch_(size|seconds)_(sum|count)|^encoder_finish_seconds_(sum|count)" "$OUT/encoder_before.txt" "$OUT/encoder_after.txt"
fi
stop_stack
pack_results
