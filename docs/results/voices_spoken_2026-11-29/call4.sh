#!/usr/bin/env bash
# Issue 60's "no work done twice": the flow's conformer token encoder runs over prompt + window (up to 80 tokens, 320
# frames in its upsampled layers) in every call. What keeping its state across a stream's calls could save is at most
# its share of a call: timed here alone, at the real size in bf16, eagerly and replayed from a CUDA graph (as the
# stack's flow graphs hold it), for a first call's rows (1 x 56 tokens) and steady calls' (16 and 32 x 80 tokens).
#   bash docs/results/voices_spoken_2026-11-29/call4.sh
#
# Predicted (written 2026-11-29 20:31 UTC, before the call): in a graph ~0.6-1.0 ms at 1 x 56 (~200 kernels of
# 3-4 us), ~1.0-1.5 ms at 16 x 80, ~1.5-2.5 ms at 32 x 80: 2-4% of the calls' 21.9 / 43.2 / 63.7 ms
# (megakernel-2026-11-29).
source bench/wheel_site.sh
python3 - <<'PY'
import statistics, torch
from services.vocoder.codec import checkpoint, config
torch.manual_seed(0)
flow, _ = checkpoint.random_codec(config.moss_speech(), 0)
flow = flow.to("cuda", torch.bfloat16).eval()
enc, proj, emb = flow.encoder, flow.encoder_proj, flow.input_embedding

def run(tokens, lengths, context):
    x = emb(tokens)
    return proj(enc(x, lengths, context, True))

def timed(fn, n=50):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)

print(f"{'rows x tokens':>14} {'eager ms':>9} {'graph ms':>9} {'kernels':>8}")
with torch.inference_mode():
    for B, T in ((1, 56), (16, 80), (32, 80)):
        tokens = torch.randint(0, 16384, (B, T), device="cuda")
        lengths = torch.full((B,), T - 3, device="cuda")
        context = torch.full((B,), 3, device="cuda")
        for _ in range(3):
            run(tokens, lengths, context)
        torch.cuda.synchronize()
        eager = timed(lambda: run(tokens, lengths, context))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                run(tokens, lengths, context)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run(tokens, lengths, context)
        graph = timed(g.replay)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            run(tokens, lengths, context); torch.cuda.synchronize()
        kernels = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
        print(f"{B:>6} x {T:<6} {eager:9.2f} {graph:9.2f} {kernels:8d}")
PY
