#!/usr/bin/env bash
# The real-size random stack on one GPU, as a user starts it:
#   moss-serve up --device cuda --preset moss-speech ... ; moss-serve say "..."
# Expects the wheels of bench/gpu_smoke.sh in .whl/. Prints each `say`'s per-stage timings.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/protos PYTHONUNBUFFERED=1
serve() { python3 -c "import sys; from services.cli import main; sys.exit(main())" "$@"; }
t0=$(date +%s.%N)
serve up --device cuda --preset moss-speech --kv-cache-gb 16 --max-num-seqs 32 > "$OUT/up.log" 2>&1 &
up=$!
ready=""
for _ in $(seq 1 150); do  # the gateway answers before the llm has captured its graphs: retry
  if serve say "warm up" -o "$OUT/warmup.wav" --max-new-tokens 8 > /dev/null 2>&1; then ready=1; break; fi
  sleep 2
done
echo "stack ready after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
if [[ -n $ready ]]; then
  for i in 1 2 3; do
    serve say "Hello! Tell me about the weather today, please." -o "$OUT/say_$i.wav" --max-new-tokens 75 --seed $i \
      2>&1 | tee -a "$OUT/say.log"
  done
fi
kill -TERM $up; wait $up  # (SIGINT would not do: a non-interactive shell starts background jobs ignoring it)
grep -iE "error|traceback" "$OUT/up.log" | head -5
tail -3 "$OUT/up.log"
