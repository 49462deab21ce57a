#!/usr/bin/env bash
# Written 2026-11-30 ~23:45 UTC: bench/gpu_smoke.sh's test groups file by file, each under its own time limit and the
# whole under the device call's, so that a slow file costs its own limit and no other file's result (a whole group
# in one pytest call had timed out and printed nothing). A line per file in $OUT/summary.txt, its log beside.
#   bash docs/results/gpu_tests_2026-11-30/run_files.sh DEADLINE_S PER_FILE_S FILE...
source bench/wheel_site.sh
export PYTEST_ADDOPTS="--durations=6 ${PYTEST_ADDOPTS:-}"
deadline=$(( $(date +%s) + $1 )); per_file=$2; shift 2
for f in "$@"; do
  left=$(( deadline - $(date +%s) ))
  (( left < 20 )) && { echo "$f: not run (the call's time spent)" | tee -a "$OUT/summary.txt"; continue; }
  limit=$(( left < per_file ? left : per_file ))
  name=$(basename "$f" .py); start=$(date +%s)
  timeout -s INT -k 15 "$limit" python3 -m pytest -q -p no:cacheprovider "$f" > "$OUT/$name.log" 2>&1; rc=$?
  echo "$f: rc $rc in $(( $(date +%s) - start )) s: $(grep -E '(passed|failed|error|skipped)' "$OUT/$name.log" | tail -1)" \
    | tee -a "$OUT/summary.txt"
  { echo "== $f"; sed -n '/slowest/,/^=/p' "$OUT/$name.log" | head -8; } >> "$OUT/durations.txt"
done
# logs of passing files are left out of what comes back (at most 8 files): only the failures' and the summary
for f in "$OUT"/test_*.log; do grep -qE "^(FAILED|ERROR)| failed|error" "$f" || rm -f "$f"; done
