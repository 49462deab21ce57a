#!/usr/bin/env bash
# Admission growth A/B (issue 23), one stack, two gateways in front of it one after the other: a, the stack's own
# (its default --admit-growth 0: the limit grows by 2 a decision), and b (--admit-growth 0.4: in proportion to TTFA's room).
# Each gets Poisson 30/s for 20 s, then 256 streams started over 6 s (replies of 2-20 s).
#   NAME=defaults [GW="gateway flags for both"] bash docs/results/admit_growth_2026-11-28/call.sh [moss-serve up flags...]
# e.g. the opt-in trades: NAME=trades GW="--admit-initial-turns 96" bash ... --flow-steps 5 --quantization fp8
# Predicted (not yet run; written 2026-11-28 when the session had no device time left): at the defaults, TTFA p95 sits
# near its 0.28 s target, so the step stays ~2 and b admits what a does (334-361 of 600, 118-130 of 256, +-5%); with
# the trades (--flow-steps 5 --quantization fp8, TTFA p95 ~0.2 s) from a start of 48, b's limit doubles in ~3.5 s
# (0.4 x 0.27 = +11% a decision): Poisson 30 544 -> 585-600 admitted, the ramp 212 -> 240-256, both >= 99% stall-free.
# Gateway a also differs from stop 50's run with the same flags (544 at Poisson 30): a refusal since the last decision
# now counts as the limit holding turns back, so it grows at decisions where turns had ended since: 550-580.
# (Stop 50's ramp, 212 of 256, started at 96: GW="--admit-initial-turns 96" compares with it.)
# Call 5 (written 2026-11-28 after calls 1-2, before call 5): NAME=steps7 bash ... --flow-steps 7, a smaller trade.
# Predicted from 10 steps (vocoder first chunk 66 ms, 334-361 of 600) and 5 (36 ms, 492): ~6 ms a step, so ~48 ms at 7,
# and 400-440 of 600 at Poisson 30, 140-165 of the ramp's 256; b again within +-5% of a (TTFA p95 near its target).
set -uo pipefail
OUT=${OUT:-/tmp/out}
name=${NAME:-defaults}
GATEWAY_B="--admission headroom --max-starting-turns 16 --admit-growth 0.4 ${GW:-}" RATES=${RATES:-30} LEVELS=${LEVELS:-256} BURST=${BURST:-0} \
  OUT=$OUT/$name timeout "${STACK_SECONDS:-560}" bash bench/overload.sh ${GW:-} "$@" 2>&1 | grep -vE "^\s*$|it/s|%\|" | tail -40
mkdir -p "$OUT/$name/r" && tar xzf "$OUT/$name/results.tgz" -C "$OUT/$name/r"
for g in a b; do
  echo "== gateway $g: the limit (every 0.5 s; start, then the highest and the last of each 10 s)"
  python3 - "$OUT/$name/r/$g/timeline.tsv" <<'PY'
import sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()[1:]]
rows = [(float(t), float(l or 0), float(r or 0)) for t, l, r, *_ in rows if l]
t0 = rows[0][0]
for k in range(0, int(rows[-1][0] - t0) + 1, 10):
    part = [r for r in rows if k <= r[0] - t0 < k + 10]
    if part:
        print(f"  {k:4d}-{k + 10:<4d} s: limit max {max(p[1] for p in part):5.0f} last {part[-1][1]:5.0f};"
              f" running max {max(p[2] for p in part):4.0f}")
PY
done
grep -h "admission limit" "$OUT/$name/up.log" "$OUT/$name/gateway_b.log" 2> /dev/null | tail -6
rm -rf "$OUT/$name/r"
(cd "$OUT" && tar czf "$name.tgz" "$name" && rm -rf "$name")
