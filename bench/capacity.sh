#!/usr/bin/env bash
# End-to-end capacity at the real size on one GPU (issue 9): the three services with random weights at the
# MOSS-Speech dimensions and the 24 kHz / 80-band / hop-480 vocoder, then `moss-serve bench` sweeping
# concurrency, each request ~6 s of audio (75 tokens). Expects the wheels of bench/gpu_smoke.sh in .whl/.
#   bash bench/capacity.sh [concurrencies]        # default 1,4,16,32,64,128,192,256
set -uo pipefail
OUT=${OUT:-/tmp/out}
LEVELS=${1:-1,4,16,32,64,128,192,256}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/protos PYTHONUNBUFFERED=1
serve() { python3 -c "import sys; from services.cli import main; sys.exit(main())" "$@"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
serve up --device cuda --preset moss-speech --kv-cache-gb 32 --max-num-seqs 256 > "$OUT/up.log" 2>&1 &
up=$!
ready=""
for _ in $(seq 1 150); do  # until the stack answers (the llm captures its graphs after its port opens)
  if serve say "warm up" -o /tmp/warmup.wav --max-new-tokens 8 > /dev/null 2>&1; then ready=1; break; fi
  sleep 2
done
if [[ -n $ready ]]; then
  serve bench --concurrency "$LEVELS" --max-new-tokens 75 --warmup 4 --no-progress --out "$OUT/capacity" \
    2>&1 | tee "$OUT/capacity.log"
fi
kill -TERM $up; wait $up  # (SIGINT would not do: a non-interactive shell starts background jobs ignoring it)
grep -iE "error|traceback" "$OUT/up.log" | head -5
