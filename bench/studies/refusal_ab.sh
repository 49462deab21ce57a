#!/usr/bin/env bash
# A full gateway's refusal bursts, this tree against another one (OLD_TREE: a directory holding that tree's services/,
# protos/ and bench/, e.g. `git archive REV services protos bench | tar -x -C DIR`), on one real-size stack of this
# tree (every refusal within 50 ms). For each of ROUNDS rounds (default 2), this tree's gateway and then the
# other's take port 50071 in turn, are made full (--max-turns 4, --max-queued-turns 0, 4 long calls held), and get
# REPS bursts of 128 (default 6) with gRPC's floor measured beside them (bench/refusal_floor.py); then each tree's
# bench/studies/refusal_path.py (its own work for one refusal, in process). Results: $OUT/ab_<tree>_<round>.json, a table.
#   OLD_TREE=/path/to/old bash bench/studies/refusal_ab.sh [moss-serve up flags...]   (STACK_FLAGS: "--kv-cache-gb 32 --max-num-seqs 256")
set -uo pipefail
source "$(dirname "$0")/stack.sh"
OLD_TREE=$(cd "${OLD_TREE:?OLD_TREE: the tree to compare against}" && pwd)
NEW_TREE=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
start_stack ${STACK_FLAGS---kv-cache-gb 32 --max-num-seqs 256} "$@" || exit 1
for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in new old; do
    dir=$([ $tree = new ] && echo "$NEW_TREE" || echo "$OLD_TREE")
    # the tree's own services: its directory first on the path, and the working directory (python -c puts it first)
    (cd "$dir" && PYTHONPATH=$WORK/site:$dir:$dir/protos setsid python3 -c "$SERVE_PY" gateway --port 50071 \
      --metrics-port 9171 --http-port 0 --max-turns 4 --max-queued-turns 0 > "$OUT/gateway_${tree}_$round.log" 2>&1) &
    pid=$!
    sleep 5
    echo "round $round, the $tree tree's gateway:"
    python3 "$NEW_TREE/bench/refusal_floor.py" --burst 128 --reps "${REPS:-6}" --target 127.0.0.1:50071 --hold 4 \
      --json "$OUT/ab_${tree}_$round.json" | tail -n +4
    pkill -TERM -f "gateway --port 50071"; wait "$pid" 2> /dev/null
  done
done
for tree in new old; do
  dir=$([ $tree = new ] && echo "$NEW_TREE" || echo "$OLD_TREE")
  echo "the $tree tree's own work for a refusal:"
  [ -f "$dir/bench/studies/refusal_path.py" ] || cp "$NEW_TREE/bench/studies/refusal_path.py" "$dir/bench/"  # (it imports its own tree)
  (cd "$dir" && PYTHONPATH=$WORK/site:$dir:$dir/protos python3 "$dir/bench/studies/refusal_path.py" --calls 20000 --reps 5 \
    --json "$OUT/path_$tree.json" 2>&1 | tail -3)
done
stop_stack
