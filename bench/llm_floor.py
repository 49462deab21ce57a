"""The llm benchmark's floor (bench/llm_engine.py): the audio path's matrix products replayed from a CUDA
graph, and the GPU's copy bandwidth for reading K/V once; what a decode or prefill step cannot beat."""

from __future__ import annotations

import statistics

import torch

try:
    from bench.measure import times
except ImportError:  # run as a script: bench/ itself is on sys.path
    from measure import times


# ---- floors ---------------------------------------------------------------------------------------------------

def audio_path_weights(model):
    m = model.model
    layers = list(m.shared_block.layers) + list(m.audio_block.layers)
    ws = []
    for layer in layers:
        a, f = layer.self_attn, layer.mlp
        ws += [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, f.gate_proj.weight, f.up_proj.weight, f.down_proj.weight]
    return ws + [model.audio_lm_head.weight]


def gemm_floor(model, tokens: int, device, reps: int = 20, quantization: str = "none") -> float:
    """Seconds for the audio path's GEMMs alone at `tokens` rows (CUDA graph on GPU). quantization "fp8": the
    layers' weights as the FP8 runner holds them (the head stays), each product with its input's quantization
    (runner/fp8.py), so the floor is the chosen arithmetic's own."""
    from services.llm.runner import fp8

    ws = audio_path_weights(model)
    if quantization == "fp8":
        ws = [fp8.Fp8Weight.of(w) for w in ws[:-1]] + ws[-1:]
    dtype = ws[-1].dtype
    inputs = {w.shape[1]: torch.randn(tokens, w.shape[1], device=device, dtype=dtype) for w in ws}

    def run():
        for w in ws:
            fp8.linear(inputs[w.shape[1]], w)

    with torch.inference_mode():
        run()
        graph = None
        if device.type == "cuda":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            run = graph.replay
            for _ in range(3):
                run()
        seconds = statistics.median(times(run, reps, device))
    graph = inputs = ws = None
    return seconds


def copy_bandwidth(device, nbytes: int | None = None, reps: int = 5, copies: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + bytes written."""
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    def copy():
        for _ in range(copies):
            dst.copy_(src)

    seconds = statistics.median(times(copy, reps, device)) / copies
    src = dst = None  # freed before what comes next
    return 2 * nbytes / seconds


def audio_kv_bytes_per_position(cfg, dtype) -> int:
    """K and V of one position over the audio path's layers (32 shared + 4 audio)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return (cfg.num_shared_layers + cfg.num_modality_layers) * 2 * cfg.num_key_value_heads * cfg.head_dim * itemsize
