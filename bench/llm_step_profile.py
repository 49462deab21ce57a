"""Where a decode step's time goes: host preparation, the captured graph's GPU time, heads + sampling, and
the host's postprocessing, per batch size; then the top kernels of one eager step (torch profiler).

    python bench/llm_step_profile.py --preset moss-speech --device cuda --batches 1,64 --context 512
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model.checkpoint import random_model
from services.llm.model.config import preset
from services.llm.model.tokenizer import tiny_tokenizer


def fill(engine, cfg, batch, context, steps):
    s = SamplingSettings(max_new_tokens=steps + 64, min_new_tokens=steps + 64, seed=0)
    g = torch.Generator().manual_seed(1)
    for b in range(batch):
        ids = torch.randint(0, min(cfg.vocab_size, 150000), (context - 1,), generator=g).tolist() + [cfg.sosp_token_id]
        engine.add(engine.make_sequence(GenerationRequest(f"r{b}", s, ChunkSettings(), text_ids=ids)))
    while any(seq.num_steps == 0 for seq in engine.sequences.values()):
        engine.step()


def timed_steps(engine, steps):
    """Wrap the runner's graph replay with CUDA events; → per-step dicts of milliseconds."""
    runner = engine.runner
    rows = []
    original = runner._run_decode

    def run_decode(seqs):
        t0 = time.perf_counter()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ev[0].record()
        out = original(seqs)
        ev[1].record()
        rows[-1]["host_prep_and_launch_ms"] = (time.perf_counter() - t0) * 1e3
        rows[-1]["events"] = ev
        return out

    runner._run_decode = run_decode
    try:
        for _ in range(steps):
            rows.append({})
            torch.cuda.synchronize()
            t = time.perf_counter()
            engine.step()
            torch.cuda.synchronize()
            rows[-1]["step_ms"] = (time.perf_counter() - t) * 1e3
    finally:
        runner._run_decode = original
    for r in rows:
        ev = r.pop("events", None)
        r["graph_gpu_ms"] = ev[0].elapsed_time(ev[1]) if ev else float("nan")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="moss-speech")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kv-cache-gb", type=float, default=8.0)
    args = p.parse_args()
    cfg = preset(args.preset)
    device = torch.device(args.device)
    model = random_model(cfg, device=device, dtype=torch.bfloat16)
    tok = tiny_tokenizer(preset("tiny"))
    print(f"{'batch':>5} {'step':>8} {'graph GPU':>10} {'host prep':>10} {'rest':>8}")
    for batch in [int(b) for b in args.batches.split(",")]:
        for graphs in (True, False):
            engine = LLMEngine(model, tok, EngineConfig(kv_cache_bytes=int(args.kv_cache_gb * (1 << 30)), max_num_seqs=max(batch, 8),
                                                       max_num_batched_tokens=8192, cuda_graphs=graphs))
            fill(engine, cfg, batch, args.context, args.steps)
            rows = timed_steps(engine, args.steps)[3:]
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            print(f"{batch:5d} {med['step_ms']:7.2f}ms {med['graph_gpu_ms']:8.2f}ms {med['host_prep_and_launch_ms']:8.2f}ms "
                  f"{med['step_ms'] - med['graph_gpu_ms']:6.2f}ms  {'graphs' if graphs else 'eager'}")
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(4):
                    engine.step()
                torch.cuda.synchronize()
            sort = "cuda_time_total" if not graphs else "cpu_time_total"
            print(prof.key_averages().table(sort_by=sort, row_limit=22, max_name_column_width=50))
            for sid in list(engine.sequences):
                engine.abort(sid)
            del engine
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
