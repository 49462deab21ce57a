# Sourced by bench/stack_smoke.sh and bench/capacity.sh: the real-size random stack on a lent GPU machine.
#   start_stack [moss-serve up flags...]   start it (log in $OUT/up.log) and wait until a `say` goes through;
#                                         returns non-zero if it never did
#   stop_stack                            stop it (SIGTERM), then whatever of its process group is left, and
#                                         show any error it logged
#   scrape PORT FILE                      a service's /metrics into FILE
# The stack runs as `moss-serve up` does by default on CUDA: llm and vocoder share the GPU through a CUDA
# MPS daemon of their own; MPS=0 in the environment runs it with --no-mps (they time-slice the GPU).
# DEVICE and PRESET (default cuda, moss-speech) choose another; WHEELS=0 skips installing the wheels of
# bench/gpu_smoke.sh from .whl/ (where they are installed already). Temporary files: $WORK, a mktemp -d removed on exit.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ "${WHEELS:-1}" != 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl || exit 1
fi
export PYTHONPATH=$WORK/site:$PWD:$PWD/protos PYTHONUNBUFFERED=1
SERVE_PY="import sys; from services.cli import main; sys.exit(main())"
serve() { python3 -c "$SERVE_PY" "$@"; }

start_stack() {
  local t0
  t0=$(date +%s.%N)
  # python itself in the background, not the serve function: $! must be the process that stop_stack signals
  # (a function runs in a subshell, and SIGTERM to it left the stack running, holding the GPU and its ports);
  # in a process group of its own (setsid: not a group leader here, so it keeps its pid), which stop_stack ends
  setsid python3 -c "$SERVE_PY" up --device "${DEVICE:-cuda}" --preset "${PRESET:-moss-speech}" \
    $( [ "${MPS:-1}" = 0 ] && echo --no-mps ) "$@" > "$OUT/up.log" 2>&1 &
  STACK_PID=$!
  # Killed (e.g. by `timeout`): stop the stack on the way out, or it holds the GPU and its ports for the next one (an
  # H100 ran out of memory that way). Bash runs the trap once the command in the foreground has returned.
  trap 'exit 143' TERM INT
  trap 'stop_stack; rm -rf "$WORK"' EXIT
  for _ in $(seq 1 150); do  # the gateway answers before the llm has captured its graphs: retry
    if serve say "warm up" -o "$WORK/warmup.wav" --max-new-tokens 8 --timeout 30 > /dev/null 2>&1; then  # a hung stack fails in minutes
      echo "stack ready after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
      return 0
    fi
    sleep 2
  done
  echo "the stack never answered: see $OUT/up.log"
  return 1
}

stop_stack() {
  [ -n "${STACK_PID:-}" ] || return 0  # (stopped already: the exit trap comes after an explicit stop)
  kill -TERM "$STACK_PID"; wait "$STACK_PID"  # (not SIGINT: a non-interactive shell starts background jobs ignoring it)
  grep -iE "error|traceback" "$OUT/up.log" | head -5
  tail -3 "$OUT/up.log"
  if pkill -KILL -g "$STACK_PID" 2> /dev/null; then  # never let a stack outlive its run; only this one's processes
    echo "stop_stack: processes of this stack still running after moss-serve up stopped; killed them"
  fi
  STACK_PID=
}

# scrape PORT FILE: a service's Prometheus metrics now (cumulative counters: a load's own are the difference of two)
scrape() {
  python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$1/metrics').read().decode())" > "$2"
}

# Pack $OUT's results into $OUT/results.tgz (the device tool brings back few files) and remove what was packed.
pack_results() {
  (cd "$OUT" && tar czf "$WORK/results.tgz" --exclude '*.log' . && mv "$WORK/results.tgz" . \
    && find . -mindepth 1 -type d -prune -exec rm -rf {} +)
}
