#!/usr/bin/env bash
# Run 2026-11-30 08:45 UTC (written 2026-11-30 07:25 UTC): the spoken figures of
# voices_spoken_2026-11-29 measured again with the bench's clocks read as the audio is handed over, not once the write
# returns (docs/benchmarks.md, barge-in-clock-2026-11-30): one spoken session, 128 started over 6 s, 64 hands-free
# barge-ins 0.5 s into replies of 20 s. The stack at the defaults, once every vocoder graph is captured.
#   bash docs/results/spoken_2026-11-30/next_call1.sh
#
# Predicted (written 2026-11-30 07:25 UTC, before any run): one session's end of speech -> first audio p50 99-105 ms
# (98.8); at 128 the p95 280-300 ms (280) with 100-115 admitted (109: the flow's capacity, issue 60); the old reply's
# last audio after the new speech began p95 19-40 ms and max 25-60 ms (19 / 23): the old clock read late by the
# client's event-loop lag, a few ms on an idle client and more with 64 sessions on one loop.
set -uo pipefail
source bench/stack.sh
IN=$PWD/.whl/inputs
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if start_stack --kv-cache-gb 32 --max-num-seqs 256; then
  for _ in $(seq 1 240); do grep -q "every CUDA graph captured" "$OUT/up.log" && break; sleep 0.5; done
  grep -E "every CUDA graph captured" "$OUT/up.log" | cut -c1-220
  serve bench --speech "$IN/question.flac" --concurrency 1 --requests 4 --turns 2 --max-new-tokens 25 --warmup 1 \
    --no-progress --out "$OUT/spoken1" 2>&1 | grep -E "^\| 1 " | head -3
  serve bench --speech "$IN/question.flac" --concurrency 128 --ramp 6 --requests 128 --turns 1 \
    --reply-seconds 2-20 --warmup 0 --no-progress --out "$OUT/spoken128" 2>&1 | grep -E "^\| 128|^ *128" | head -4
  serve bench --speech "$IN/question.flac" --concurrency 64 --ramp 6 --requests 64 --turns 1 --barge-in 0.5 \
    --reply-seconds 20-20 --warmup 0 --no-progress --out "$OUT/barge64" 2>&1 | tail -14 | head -8
fi
stop_stack
cp "$OUT/up.log" "$OUT/up.txt"
pack_results
