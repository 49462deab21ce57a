#!/usr/bin/env bash
# One stack at the defaults (`moss-serve up --device cuda --preset moss-speech --kv-cache-gb 32 --max-num-seqs 256`),
# with a voices directory (one random voice of 40 codes, as bench/voices.py's own stack) and a stand-in speaker model,
# once every vocoder graph is captured:
#   1. voices (issue 65): bench/voices.py --gateway, a 10.06 s recording (espeak-ng, 16 kHz; cut to <= 7.04 s at a
#      pause by the gateway) made a voice alone x3, then beside 64 streams of 8 s x3;
#   2. one typed stream: TTFA (the baseline of the spoken turn below);
#   3. one spoken session (issue 63), 4 sessions of 2 turns one at a time, a 5.13 s question, the SM clock sampled
#      every 50 ms (nvidia-smi): is the lone turn's slower end-to-audio an idle GPU's clock?
#   4. 128 spoken sessions started over 6 s (issue 63's target: >= 99% admitted and stall-free, p95 <= 250 ms);
#   5. 64 hands-free sessions each barging in once, 1.5 s into the reply (issue 63: the old reply's last audio <= 150 ms
#      after the new speech starts, p95).
# Inputs carried in .whl/inputs (not in the tree): recording.flac, question.flac, speaker.onnx.
#   bash docs/results/voices_spoken_2026-11-29/call1.sh
#
# Predicted (written 2026-11-29 20:06 UTC, before the call; an H200):
#   1. CreateVoice alone 0.35-0.6 s (the encoder's codes of 10 s ~30 ms; mel + x-vector on the CPU ~0.15 s; the
#      prefix recorded on the GPU under exclusive(), 10 flow steps over ~350 frames ~0.1-0.2 s); beside 64 streams
#      0.4-0.9 s, and the 64 streams 100% stall-free as without it (the exclusive gate holds the vocoder's calls
#      ~0.2 s, less than the ~1 s of audio a stream has ahead).
#   2. one typed stream: TTFA p50 85-92 ms (88.6 ms on 2026-11-29).
#   3. one spoken session: end of speech -> first audio p50 110-150 ms (146 ms in the issue); the SM clock at its
#      idle floor (~345 MHz) when a turn starts, rising within ~20-50 ms.
#   4. 128 spoken over 6 s: 122-128 admitted, 100% stall-free, p95 200-260 ms (204-255 with 128 places before).
#   5. barge-in at 64: the old reply's last audio 60-200 ms after the new speech starts (the VAD's ~100 ms onset);
#      nothing held after.
set -uo pipefail
source bench/stack.sh
IN=$PWD/.whl/inputs
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "
from services.vocoder.codec.config import moss_speech
from services.vocoder.codec.voice import random_voice, save_voice
save_voice(random_voice(moss_speech().flow, prompt_tokens=40), '$WORK/voices')"
if start_stack --kv-cache-gb 32 --max-num-seqs 256 --voices-dir "$WORK/voices" --speaker-model "$IN/speaker.onnx"; then
  for _ in $(seq 1 240); do grep -q "every CUDA graph captured" "$OUT/up.log" && break; sleep 0.5; done
  grep -E "every CUDA graph captured|speaker places|max-speakers|places" "$OUT/up.log" | cut -c1-220 | head -5
  timeout 200 python3 bench/voices.py --gateway 127.0.0.1:50051 --streams 64 --recording "$IN/recording.flac" \
    --trials 3 --json "$OUT/voices.json" 2>&1 | tail -12
  serve bench --concurrency 1 --requests 6 --max-new-tokens 25 --warmup 2 --no-progress --out "$OUT/typed1" \
    2>&1 | tail -6
  nvidia-smi --query-gpu=timestamp,clocks.sm,utilization.gpu --format=csv,noheader -lms 50 > "$OUT/clocks.csv" &
  CLOCKS=$!
  serve bench --speech "$IN/question.flac" --concurrency 1 --requests 4 --turns 2 --max-new-tokens 25 --warmup 1 \
    --no-progress --out "$OUT/spoken1" 2>&1 | tail -6
  kill $CLOCKS
  serve bench --speech "$IN/question.flac" --concurrency 128 --ramp 6 --requests 128 --turns 1 \
    --reply-seconds 2-20 --warmup 0 --no-progress --out "$OUT/spoken128" 2>&1 | tail -6
  serve bench --speech "$IN/question.flac" --concurrency 64 --ramp 6 --requests 64 --turns 1 --barge-in 1.5 \
    --reply-seconds 6-10 --warmup 0 --no-progress --out "$OUT/barge64" 2>&1 | tail -8
  for s in gateway:9091 llm:9092 vocoder:9093 encoder:9094; do scrape "${s#*:}" "$OUT/metrics_${s%%:*}.txt"; done
  grep -E "voice|speaker places" "$OUT/up.log" | grep -v DEBUG | cut -c1-200 | tail -8
fi
stop_stack
cp "$OUT/up.log" "$OUT/up.txt"
pack_results
