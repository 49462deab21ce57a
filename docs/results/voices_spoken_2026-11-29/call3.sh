#!/usr/bin/env bash
# After calls 1-2, with the encoder's rounds that hold an ended turn taking only the ended streams (worker.py) and the
# prefix's free place run through at the start (prefix.py). One stack at the defaults, as call 1, once every vocoder
# graph is captured:
#   1. bench/voices.py --gateway: the first voice after the start, alone, then beside 64 streams (x2);
#   2. one spoken session (4 sessions of 2 turns);
#   3. 128 spoken sessions started over 6 s;
#   4. 64 hands-free sessions barging in 0.5 s into replies of 20 s (generated at ~5x real time: still being made
#      when the new speech starts, where call 1's replies of 6-10 s had all been sent by then).
#   bash docs/results/voices_spoken_2026-11-29/call3.sh
#
# Predicted (written 2026-11-29 20:23 UTC, before the call): 1. the first voice 0.5-0.8 s (4.13 s in call 1), beside 64
# streams 0.5-0.8 s, 100% stall-free. 2. end of speech -> first audio p50 100-110 ms (108.0 in call 1). 3. the
# encoder's finish 92 -> 20-40 ms mean (207 -> 30-60 ms for the slowest tenth); admitted 78 -> 90-128 of 128; p95 380 ->
# 280-330 ms. 4. the old reply's last audio p95 30-150 ms after the new speech starts (the VAD's onset, then the cancel
# through the stages); nothing held after.
set -uo pipefail
source bench/stack.sh
IN=$PWD/.whl/inputs
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "
from services.vocoder.codec.config import moss_speech
from services.vocoder.codec.voice import random_voice, save_voice
save_voice(random_voice(moss_speech().flow, prompt_tokens=40), '$WORK/voices')"
if start_stack --kv-cache-gb 32 --max-num-seqs 256 --voices-dir "$WORK/voices" --speaker-model "$IN/speaker.onnx"; then
  for _ in $(seq 1 240); do grep -q "every CUDA graph captured" "$OUT/up.log" && break; sleep 0.5; done
  grep -E "every CUDA graph captured" "$OUT/up.log" | cut -c1-220
  timeout 150 python3 bench/voices.py --gateway 127.0.0.1:50051 --streams 64 --recording "$IN/recording.flac" \
    --trials 2 --json "$OUT/voices.json" 2>&1 | tail -6
  serve bench --speech "$IN/question.flac" --concurrency 1 --requests 4 --turns 2 --max-new-tokens 25 --warmup 1 \
    --no-progress --out "$OUT/spoken1" 2>&1 | grep -E "^\| 1 " | head -3
  serve bench --speech "$IN/question.flac" --concurrency 128 --ramp 6 --requests 128 --turns 1 \
    --reply-seconds 2-20 --warmup 0 --no-progress --out "$OUT/spoken128" 2>&1 | grep -E "^\| 128|^ *128" | head -4
  serve bench --speech "$IN/question.flac" --concurrency 64 --ramp 6 --requests 64 --turns 1 --barge-in 0.5 \
    --reply-seconds 20-20 --warmup 0 --no-progress --out "$OUT/barge64" 2>&1 | tail -14 | head -8
  for s in gateway:9091 llm:9092 vocoder:9093 encoder:9094; do scrape "${s#*:}" "$OUT/metrics_${s%%:*}.txt"; done
fi
stop_stack
cp "$OUT/up.log" "$OUT/up.txt"
pack_results
