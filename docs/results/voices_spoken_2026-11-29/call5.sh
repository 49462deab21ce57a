#!/usr/bin/env bash
# Call 4 found the flow's conformer encoder at 6.33 ms of a steady call of 32 streams replayed from a graph (predicted
# 1.5-2.5 ms). Where those go: the profiler's CUDA kernels of one eager run at 32 x 80 tokens, by total time.
#   bash docs/results/voices_spoken_2026-11-29/call5.sh
# Predicted (2026-11-29 20:32 UTC): the relative-position attention's [B, h, T, T] work (the gather of the position
# scores by an expanded index, the masks, the softmax) in the 4 layers at 320 frames: over half of it.
source bench/wheel_site.sh
python3 - <<'PY'
import torch
from services.vocoder.codec import checkpoint, config
flow, _ = checkpoint.random_codec(config.moss_speech(), 0)
flow = flow.to("cuda", torch.bfloat16).eval()
B, T = 32, 80
tokens = torch.randint(0, 16384, (B, T), device="cuda")
lengths, context = torch.full((B,), T - 3, device="cuda"), torch.full((B,), 3, device="cuda")
run = lambda: flow.encoder_proj(flow.encoder(flow.input_embedding(tokens), lengths, context, True))
with torch.inference_mode():
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as prof:
        run(); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=60))
PY
