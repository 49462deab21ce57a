#!/usr/bin/env bash
# Written 2026-12-02 ~17:24 UTC, before its run.
#   bash docs/results/calls_2026-12-02/call15.sh      (carry .whl: bench/wheels.sh --parity, for the reference)
#
# The flow's floor and peer ratios at the defaults since the attention's small tile (small-tile-2026-12-02), in one run
# each: neither bench has run on this tree.
# Predicted: codec_history alone, in graphs: a first call 16.5-19.5 ms; steady 16 streams 41-45 ms, 32 streams 58-62 ms,
# the floor 9.0-9.4 ms at 32 streams: 6.2-6.8x it; kernels: 394 an Euler step in a first call, ~550-620 in steady calls.
# Beside the llm's decode (64 sequences at 25%): 32 streams 105-120 ms (115.4 on 2026-11-30), the llm's step 1.0-1.15x.
# codec.py: ours against the reference as a serving stack would run it (bf16, batched, graphs) 2.3-2.8x to a first
# chunk, 3.1-3.6x in aggregate at 64 streams; against MOSS-Speech's own use (float32, eager) ~30x and ~180x.
set -uo pipefail
source bench/wheel_site.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 330 python3 bench/codec_history.py --streams 1,16,32 --modes history --kernels --beside-llm \
  --json "$OUT/codec_history.json" > "$OUT/codec_history.log" 2>&1; echo "codec_history rc=$?"
tail -14 "$OUT/codec_history.log"
timeout 240 python3 bench/codec.py --device cuda --streams 8,32,64 --json "$OUT/codec_peer.json" \
  > "$OUT/codec_peer.log" 2>&1; echo "codec rc=$?"
tail -24 "$OUT/codec_peer.log"
