# Sourced by bench/stack_smoke.sh and bench/capacity.sh: the real-size random stack on a lent GPU machine.
#   start_stack [moss-serve up flags...]   start it (log in $OUT/up.log) and wait until a `say` goes through;
#                                         returns non-zero if it never did
#   stop_stack                            stop it (SIGTERM) and show any error it logged
# The stack runs as `moss-serve up` does by default on CUDA: llm and vocoder share the GPU through a CUDA
# MPS daemon of their own; MPS=0 in the environment runs it with --no-mps (they time-slice the GPU).
# Expects the wheels of bench/gpu_smoke.sh in .whl/.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/protos PYTHONUNBUFFERED=1
SERVE_PY="import sys; from services.cli import main; sys.exit(main())"
serve() { python3 -c "$SERVE_PY" "$@"; }

start_stack() {
  local t0
  t0=$(date +%s.%N)
  # python itself in the background, not the serve function: $! must be the process that stop_stack signals
  # (a function runs in a subshell, and SIGTERM to it left the stack running, holding the GPU and its ports)
  python3 -c "$SERVE_PY" up --device cuda --preset moss-speech $( [ "${MPS:-1}" = 0 ] && echo --no-mps ) "$@" \
    > "$OUT/up.log" 2>&1 &
  STACK_PID=$!
  for _ in $(seq 1 150); do  # the gateway answers before the llm has captured its graphs: retry
    if serve say "warm up" -o /tmp/warmup.wav --max-new-tokens 8 --timeout 30 > /dev/null 2>&1; then  # a hung stack fails in minutes
      echo "stack ready after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
      return 0
    fi
    sleep 2
  done
  echo "the stack never answered: see $OUT/up.log"
  return 1
}

stop_stack() {
  kill -TERM "$STACK_PID"; wait "$STACK_PID"  # (not SIGINT: a non-interactive shell starts background jobs ignoring it)
  grep -iE "error|traceback" "$OUT/up.log" | head -5
  tail -3 "$OUT/up.log"
  if pgrep -f "[s]ervices.cli (llm|vocoder|gateway)" > /dev/null; then  # never let a stack outlive its run
    echo "stop_stack: services still running after moss-serve up stopped; killing them"
    pkill -KILL -f "[s]ervices.cli (llm|vocoder|gateway)"
  fi
}
