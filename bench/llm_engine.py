"""llm engine: prefill and per-step decode time of the reference runner, against the GEMM-only floor
measured in the same run (shared/DESIGN.md §5 defines it: the audio path's weight matrices, 32 shared
layers + 4 audio layers + audio head, multiplied in a CUDA graph with nothing else).

Also checks, before timing, that paged prefill + decode logits equal a dense forward on this device.

    python bench/llm_engine.py --preset moss-speech --device cuda --json out.json
    python bench/llm_engine.py --preset tiny --device cpu          # smoke run

Random weights (timing does not depend on their values). Prints a table last; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.model.checkpoint import random_model
from services.llm.model.config import preset
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine, dense_logits, traced_generation
from services.llm.model.tokenizer import tiny_tokenizer


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def audio_path_weights(model):
    m = model.model
    layers = list(m.shared_block.layers) + list(m.audio_block.layers)
    ws = []
    for layer in layers:
        a, f = layer.self_attn, layer.mlp
        ws += [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight, f.gate_proj.weight, f.up_proj.weight, f.down_proj.weight]
    return ws + [model.audio_lm_head.weight]


def gemm_floor(model, tokens: int, device, reps: int = 20) -> float:
    """Seconds for the audio path's GEMMs alone at `tokens` rows (CUDA graph on GPU)."""
    ws = audio_path_weights(model)
    inputs = {w.shape[1]: torch.randn(tokens, w.shape[1], device=device, dtype=w.dtype) for w in ws}

    def run():
        for w in ws:
            F.linear(inputs[w.shape[1]], w)

    run()
    if device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        run = graph.replay
        for _ in range(3):
            run()
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def check_paged_against_dense(model, engine, prompt_len: int, steps: int, device) -> float:
    """Max relative error of the logits of `steps` incremental positions vs one dense forward."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, min(cfg.vocab_size, 150000), (prompt_len,), generator=g).tolist()
    greedy = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=steps, min_new_tokens=steps)
    seq = engine.make_sequence(GenerationRequest("check", greedy, ChunkSettings(), text_ids=text + [cfg.sosp_token_id]))
    got = traced_generation(engine, seq)
    dense_t, dense_a = dense_logits(model, seq.text_ids, seq.audio_ids)
    worst = 0.0
    for i, (t, a) in enumerate(got):
        pos = seq.num_prompt - 1 + i
        for mine, ref in ((t, dense_t[pos]), (a, dense_a[pos])):
            assert torch.isfinite(mine).all(), "non-finite logits"
            worst = max(worst, float((mine - ref).norm() / ref.norm()))
    assert engine.block_manager.num_used == 0
    return worst


def time_engine(engine, cfg, prompt_len: int, batch: int, steps: int, device) -> tuple[float, float]:
    """→ (median prefill seconds per request, median decode step seconds) at this batch size."""
    s = SamplingSettings(temperature=0.6, max_new_tokens=steps + 1, min_new_tokens=steps + 1, seed=0)
    g = torch.Generator().manual_seed(1)
    prefill, decode = [], []
    for b in range(batch):  # prefill one by one (the reference runner's prefill is per sequence anyway)
        text = torch.randint(0, min(cfg.vocab_size, 150000), (prompt_len,), generator=g).tolist()
        engine.add(engine.make_sequence(GenerationRequest(f"r{b}", s, ChunkSettings(), text_ids=text + [cfg.sosp_token_id])))
        sync(device)
        t = time.perf_counter()
        engine.step()  # prefills the new one (and decodes the ones before it)
        sync(device)
        prefill.append(time.perf_counter() - t)
    while engine.has_work():
        sync(device)
        t = time.perf_counter()
        engine.step()
        sync(device)
        decode.append(time.perf_counter() - t)
    return prefill[0], statistics.median(decode[1:] or decode)  # prefill[0]: the only one alone in its step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--kv-cache-gb", type=float, default=4.0)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--check-only", action="store_true", help="only compare paged with dense logits")
    p.add_argument("--json")
    args = p.parse_args()
    device = torch.device(args.device)
    cfg = preset(args.preset)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    t = time.perf_counter()
    model = random_model(cfg, device=device, dtype=dtype)
    build_s = time.perf_counter() - t
    tokenizer = tiny_tokenizer(preset("tiny")) if args.preset != "tiny" else tiny_tokenizer(cfg)  # prompts are token ids
    # a step budget above the prompt: the timed prefill is one step
    engine = LLMEngine(model, tokenizer, EngineConfig(kv_cache_bytes=int(args.kv_cache_gb * (1 << 30)), max_num_seqs=64,
                                                      max_num_batched_tokens=max(2048, args.prompt_len + 1)))
    rel_err = check_paged_against_dense(model, engine, min(args.prompt_len, 200), 4, device)
    if args.check_only:
        print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, {args.preset}, {dtype}: "
              f"paged vs dense logits, max rel err {rel_err:.2e}")
        return
    rows = []
    prefill_s, _ = time_engine(engine, cfg, args.prompt_len, 1, 2, device)  # warm-up
    for batch in [int(b) for b in args.batches.split(",")]:
        prefill_s, step_s = time_engine(engine, cfg, args.prompt_len, batch, args.steps, device)
        rows.append({"what": f"decode step, batch {batch}", "ours_ms": step_s * 1e3, "floor_ms": gemm_floor(model, batch, device) * 1e3})
    rows.insert(0, {"what": f"prefill {args.prompt_len} tokens", "ours_ms": prefill_s * 1e3,
                    "floor_ms": gemm_floor(model, args.prompt_len, device, reps=5) * 1e3})
    result = {
        "preset": args.preset, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype), "torch": torch.__version__, "build_seconds": build_s,
        "paged_vs_dense_max_rel_err": rel_err, "rows": rows, "date": time.strftime("%Y-%m-%d"),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(f"\n{result['device']}, {args.preset}, {dtype}; paged vs dense logits: max rel err {rel_err:.2e}")
    print(f"{'':28} {'ours':>10} {'GEMM floor':>11} {'ours/floor':>11}")
    for r in rows:
        print(f"{r['what']:28} {r['ours_ms']:8.2f}ms {r['floor_ms']:9.2f}ms {r['ours_ms'] / r['floor_ms']:10.1f}x")


if __name__ == "__main__":
    main()
