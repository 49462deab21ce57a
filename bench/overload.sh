#!/usr/bin/env bash
# Overload at the real size on one GPU: the stack as capacity.sh starts it, plus a second gateway in front
# of the same llm and vocoder, so that two admission rules meet the same loads on one stack. Each gets the outside
# client's loads, replies of 2 to 20 s (REPLY, default 2-20):
#   Poisson arrivals at RATES per second (default 20,30,40; none: ""), ARRIVAL_SECONDS of arrivals each (default 20);
#   LEVELS streams started over 6 s, one request each (default 192,256; none: "");
#   BURST streams started at the same instant (default 128; 0: none; a list: one burst each, on the idle stack);
#   REFUSALS (default 0: none): after the loads, a burst of that many at a full gateway (bench/refusal_floor.py);
#   REFUSAL_FLAGS: flag sets for that full gateway, separated by ";" (one run of bursts each; default: its defaults);
#   HTTP_TTFB (default 0: none): after the loads, that many rounds of bench/http_ttfb.py on the idle stack (its gRPC
#   and HTTP doors side by side).
# RATES_A, LEVELS_A, BURST_A (and _B) set them for one gateway only.
#   bash bench/overload.sh [moss-serve up flags...]
# STACK_FLAGS (default "--kv-cache-gb 32 --max-num-seqs 256") go to moss-serve up before the arguments. GATEWAY_A (default: the stack's own gateway, as `moss-serve up` runs it) and GATEWAY_B (default
# "--admission headroom") are the two gateways' flags; ONLY=a or ONLY=b runs one of them. While a gateway is loaded its
# admission limit, turns running and queued, and the llm's and the vocoder's busy counters are sampled every 0.5 s
# into $OUT/<gateway>/timeline.tsv (bench/timeline.py), and its
# metrics are scraped before the loads and after each (metrics_<k>_<load>.txt): each rate is a load of its own. Results end up in $OUT/results.tgz, the logs beside it.
set -uo pipefail
source "$(dirname "$0")/stack.sh"
RATES=${RATES-20,30,40}  # (no colon: RATES="" means none)
LEVELS=${LEVELS-192,256}
BURST=${BURST:-128}
REPLY=${REPLY:-2-20}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

# gateway_b_up: the second gateway (own process group, ports 50070 / 9170) in front of the stack's llm and vocoder
gateway_b_up() {
  setsid python3 -c "$SERVE_PY" gateway --port 50070 --metrics-port 9170 --http-port 0 ${GATEWAY_B:---admission headroom} \
    > "$OUT/gateway_b.log" 2>&1 &
  GATEWAY_B_PID=$!
  for _ in $(seq 1 60); do
    serve say "warm up" -o "$WORK/b.wav" --target 127.0.0.1:50070 --max-new-tokens 8 --timeout 30 > /dev/null 2>&1 && return 0
    sleep 1
  done
  echo "gateway b never answered: see $OUT/gateway_b.log"; return 1
}

# sample METRICS_PORT FILE: the gateway's admission gauges and the stages' busy counters every 0.5 s, until killed
sample() {
  python3 "$(dirname "$0")/timeline.py" "$2" "$1" 9092 9093 &
  SAMPLER_PID=$!
}

# run DIR BENCH_FLAGS...: one load against the gateway being loaded, into $dir/DIR; its metrics after it, numbered
run() {
  local run_dir=$1; shift
  serve bench "${common[@]}" "$@" --out "$dir/$run_dir" 2>&1 | tee -a "$dir/bench.log"
  runs=$((runs + 1))
  local n
  n=$(printf %02d "$runs")
  scrape "$port" "$dir/metrics_${n}_$run_dir.txt"
  scrape 9092 "$dir/metrics_llm_${n}_$run_dir.txt"  # the stages' own counts over the load: the difference of two
  scrape 9093 "$dir/metrics_vocoder_${n}_$run_dir.txt"
}

# load NAME TARGET METRICS_PORT: every load against one gateway, results in $OUT/NAME
load() {
  local name=$1 target=$2 port=$3 dir="$OUT/$1" up=${1^^} runs=0
  local rates_var=RATES_$up levels_var=LEVELS_$up burst_var=BURST_$up
  local rates=${!rates_var-$RATES} levels=${!levels_var-$LEVELS} burst=${!burst_var-$BURST}
  local common=(--target "$target" --reply-seconds "$REPLY" --no-progress --timeout 180)
  mkdir -p "$dir"
  sample "$port" "$dir/timeline.tsv"
  scrape "$port" "$dir/metrics_00_start.txt"
  scrape 9092 "$dir/metrics_llm_00_start.txt"
  scrape 9093 "$dir/metrics_vocoder_00_start.txt"
  local warmup=4
  for rate in ${rates//,/ }; do
    run "poisson_$rate" --rate "$rate" --seconds "${ARRIVAL_SECONDS:-20}" --warmup "$warmup"
    warmup=0
  done
  for level in ${levels//,/ }; do
    run "ramp_$level" --concurrency "$level" --requests "$level" --ramp 6 --warmup 0
  done
  for b in ${burst//,/ }; do
    [ "$b" -gt 0 ] && run "burst_$b" --concurrency "$b" --requests "$b" --warmup 0
  done
  kill "$SAMPLER_PID" 2> /dev/null
}

run_a=1 run_b=1
case ${ONLY:-} in a) run_b=0 ;; b) run_a=0 ;; esac
if start_stack ${STACK_FLAGS:---kv-cache-gb 32 --max-num-seqs 256} ${GATEWAY_A:-} "$@"; then
  [ "$run_a" = 1 ] && load a 127.0.0.1:50051 9091
  if [ "$run_b" = 1 ]; then
    gateway_b_up && load b 127.0.0.1:50070 9170
    kill -TERM "$GATEWAY_B_PID" 2> /dev/null; wait "$GATEWAY_B_PID" 2> /dev/null
  fi
  scrape 9092 "$OUT/metrics_llm.txt"
  scrape 9093 "$OUT/metrics_vocoder.txt"
  if [ "${HTTP_TTFB:-0}" -gt 0 ]; then
    python3 "$(dirname "$0")/http_ttfb.py" --rounds "$HTTP_TTFB" --gateway 127.0.0.1:50051 --http 127.0.0.1:8000 \
      --json "$OUT/http_ttfb.json" | tee "$OUT/http_ttfb.txt"
  fi
  if [ "${REFUSALS:-0}" -gt 0 ]; then  # a full gateway's refusals against gRPC's own floor (bench/refusal_floor.py)
    IFS=';' read -ra full_flags <<< "${REFUSAL_FLAGS:-}"  # one full gateway per flag set (none: its defaults)
    [ ${#full_flags[@]} -eq 0 ] && full_flags=("")
    k=0
    for flags in "${full_flags[@]}"; do
      suffix=$([ $k -eq 0 ] && echo "" || echo "_$k")
      echo "full gateway$suffix: ${flags:-its defaults}"
      setsid python3 -c "$SERVE_PY" gateway --port 50071 --metrics-port 9171 --http-port 0 --max-turns 4 --max-queued-turns 0 \
        $flags > "$OUT/gateway_full$suffix.log" 2>&1 &
      full_pid=$!
      sleep 5
      python3 "$(dirname "$0")/refusal_floor.py" --burst "$REFUSALS" --target 127.0.0.1:50071 --hold 4 \
        --json "$OUT/refusal_floor$suffix.json" | tee "$OUT/refusal_floor$suffix.txt"
      kill -TERM "$full_pid" 2> /dev/null; wait "$full_pid" 2> /dev/null
      k=$((k + 1))
    done
  fi
fi
stop_stack
python3 "$(dirname "$0")/overload_report.py" "$OUT" | tee "$OUT/overload.txt"
pack_results
