#!/usr/bin/env bash
# Written 2026-12-01 ~05:55 UTC, before any run: can the llm process move between the whole GPU and a quarter of it
# from one step to the next (MPS at 100%, its busy steps on a green context of 33 multiprocessors)?
#   bash docs/results/llm_share_2026-12-01/call1.sh
#
# Predicted (ms a decode step, real size): at MPS 25% b1 6.2-6.6, b32 9-11; at 100% on the whole GPU b1 4.8-5.1,
# b32 6.5-8; graphs captured on the whole GPU replayed on the green stream: confined (b1 within 10% of the green
# capture's) or not (b1 ~4.9: then a second set of graphs is needed); graphs captured on green: b1 6.0-6.8, b32 9.5-11.5;
# their outputs equal to the whole GPU's within bf16 rounding (max abs diff <= 2% of max abs); alternating every step
# ~5.5-6 ms at b1; beside 6-stream flow calls (alone ~35 ms): the vocoder's call beside the llm at 25% and beside the
# llm on green within 10% of each other (H100: 0.43-0.51 vs 0.48-0.50 of its speed), beside the whole-GPU llm slower.
set -u
python3 -c "import torch, torch.cuda.green_contexts as g; print(torch.__version__, 'green', g.SUPPORTED, hasattr(g.GreenContext, 'Stream'))"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

timeout 100 python3 bench/studies/llm_share.py --size tiny --seconds 1 --batch 4 --windows 2 --kv-gb 0.5 2>&1 | grep -v Warning | tail -22
timeout 440 python3 bench/studies/llm_share.py --json "$OUT/call1_share.json" 2>&1 | grep -v Warning | tail -40
