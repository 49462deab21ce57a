#!/usr/bin/env bash
# After call 5: the conformer's attention with q, k and v in one product, the 1/sqrt(d_k) scale on the queries, and each
# pass over [B, h, T, T] one kernel in place (conformer.py). Then:
#   1. call 4's timing of the encoder alone (eager, graph, kernels) at 1 x 56, 16 x 80, 32 x 80;
#   2. bench/codec_history.py --streams 1,16,32 --modes history --kernels: the flow's calls as the stack makes them.
#   bash docs/results/voices_spoken_2026-11-29/call6.sh
# Predicted (2026-11-29 20:35 UTC): 1. in a graph 1.16 -> 0.9-1.0 ms, 3.59 -> 2.3-2.8 ms, 6.33 -> 3.8-4.8 ms, kernels
# 414-478 -> 330-400 (per layer: 3 products and 3 copies -> 1 and 1; 2 masked fills -> 1 and a NaN pass). 2. steady
# calls 43.2-45.3 / 63.3-63.7 ms (megakernel-2026-11-29) -> ~1 / ~2 ms less; a first call ~0.2 ms less.
source bench/wheel_site.sh
sed -n '/^python3 - <<.PY.$/,/^PY$/p' docs/results/voices_spoken_2026-11-29/call4.sh | sed '1d;$d' > "$SITE/encoder_timing.py"
python3 "$SITE/encoder_timing.py" 2>&1 | grep -v -i warn
timeout 300 python3 bench/codec_history.py --streams 1,16,32 --modes history --kernels --json "$OUT/codec_history.json" \
  2>&1 | grep -v -i warn | tail -12
