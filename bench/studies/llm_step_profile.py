"""Where a decode step's GPU time goes, in the engine's steady state (steps back to back, overlapped):
wall time per step, kernel time per step, the GPU's idle share, and the kernels by total time, with those
replayed from the decode graph told apart from those launched outside it. A Chrome trace goes to --trace.
With --join N, also what a step costs when a new request's last N prompt positions join the batch (a mixed
step, as each arrival brings in the stack), against the decode steps around it, and the kernels of each kind of step
side by side (where the mixed step's extra time goes).

    python bench/studies/llm_step_profile.py --preset moss-speech --device cuda --batches 1,64 --context 512
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 python bench/studies/llm_step_profile.py --batches 1,16,32 --context 256 --join 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections import defaultdict

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
from llm_timing import Prompts, timed_step
from torch.profiler import ProfilerActivity, profile

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model.checkpoint import random_model
from services.llm.model.config import preset
from services.llm.model.tokenizer import tiny_tokenizer
from services.llm.runner import kernel_runner


def fill(engine, cfg, batch, context, steps):
    s = SamplingSettings(max_new_tokens=steps + 64, min_new_tokens=steps + 64, seed=0)
    g = torch.Generator().manual_seed(1)
    for b in range(batch):
        ids = torch.randint(0, min(cfg.vocab_size, 150000), (context - 1,), generator=g).tolist() + [cfg.sosp_token_id]
        engine.add(engine.make_sequence(GenerationRequest(f"r{b}", s, ChunkSettings(), text_ids=ids)))
    while any(seq.num_steps == 0 for seq in engine.sequences.values()):
        engine.step()
    for _ in range(5):  # reach the steady state (steps launched ahead)
        engine.step()


def cuda_kernels(prof, into: dict | None = None) -> dict:
    """A profile's kernels → {name: [launches, us]}, added to `into` if given."""
    per_name = into if into is not None else defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per_name[e.name][0] += 1
            per_name[e.name][1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return per_name


def graph_kernel_names(engine) -> set[str]:
    """Names of the kernels one captured decode forward launches (eager run under the profiler)."""
    runner = engine.runner
    t = runner._bucket_view(runner.buckets[0])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner._decode_forward(t)
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type.name == "CUDA"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="moss-speech")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kv-cache-gb", type=float, default=8.0)
    p.add_argument("--trace", default="", help="write a Chrome trace per batch size here (prefix)")
    p.add_argument("--join", type=int, default=0, help="also time a mixed step: a new request of this many new positions joins")
    p.add_argument("--top", type=int, default=25, help="kernels listed from the whole step")
    p.add_argument("--json", default="", help="write every batch's kernels (and joins) here")
    p.add_argument("--packed-buckets", default="", help="the packed steps' row buckets, instead of the runner's own")
    args = p.parse_args()
    if args.packed_buckets:
        kernel_runner.PACKED_BUCKETS = tuple(int(b) for b in args.packed_buckets.split(","))
    results = []
    cfg = preset(args.preset)
    model = random_model(cfg, device=torch.device(args.device), dtype=torch.bfloat16)
    tok = tiny_tokenizer(preset("tiny"))
    for batch in [int(b) for b in args.batches.split(",")]:
        seqs = max(batch, 8) + (16 if args.join else 0)  # (room for the joining requests)
        engine = LLMEngine(model, tok, EngineConfig(kv_cache_bytes=int(args.kv_cache_gb * (1 << 30)), max_num_seqs=seqs,
                                                   max_num_batched_tokens=8192))
        fill(engine, cfg, batch, args.context, args.steps)
        in_graph = graph_kernel_names(engine)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) / args.steps * 1e3
        per_name = cuda_kernels(prof)
        busy = sum(v[1] for v in per_name.values()) / args.steps / 1e3
        outside = {k: v for k, v in per_name.items() if k not in in_graph}
        out_ms = sum(v[1] for v in outside.values()) / args.steps / 1e3
        out_n = sum(v[0] for v in outside.values()) / args.steps
        print(f"\n== batch {batch}, context {args.context}: {wall:.2f} ms per step (profiled); kernels {busy:.2f} ms per step "
              f"(graph {busy - out_ms:.2f}, outside the graph {out_ms:.2f} ms in {out_n:.0f} launches); "
              f"GPU idle {max(0.0, wall - busy):.2f} ms")
        print(f"{'kernel (outside the graph)':70s} {'per step':>8s} {'µs/step':>9s}")
        for name, (n, us) in sorted(outside.items(), key=lambda kv: -kv[1][1])[:30]:
            print(f"{name[:70]:70s} {n / args.steps:8.1f} {us / args.steps:9.1f}")
        print(f"{'every kernel of a step':70s} {'per step':>8s} {'µs/step':>9s} {'µs each':>8s}")
        for name, (n, us) in sorted(per_name.items(), key=lambda kv: -kv[1][1])[:args.top]:
            print(f"{name[:70]:70s} {n / args.steps:8.1f} {us / args.steps:9.1f} {us / max(n, 1):8.2f}")
        row = {"batch": batch, "context": args.context, "step_ms": wall, "kernel_ms": busy,
               "kernels": {k: {"per_step": v[0] / args.steps, "us_per_step": v[1] / args.steps}
                           for k, v in per_name.items()}}
        if args.join:
            row["join"] = join_steps(engine, cfg, args.join, args.context)
            j = row["join"]
            print(f"a new request's last {args.join} positions joining {batch}: mixed step {j['mixed_ms']:.2f} ms "
                  f"(median of {len(j['mixed'])}) against decode steps {j['decode_ms']:.2f} ms around it")
            print_join_kernels(j, args.top)
        results.append(row)
        if args.trace:
            prof.export_chrome_trace(f"{args.trace}_b{batch}.json")
        for sid in list(engine.sequences):
            engine.abort(sid)
        while engine.has_work():
            engine.step()
        del engine
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


def join_steps(engine, cfg, positions: int, context: int, joins: int = 7) -> dict:
    """Each time: one new request whose prompt shares all but its last `positions` with one already run (a
    prefix-cache hit, as a turn's system prompt and voice are in the stack), stepped until it has its first
    token; every step timed alone (synchronised). → the mixed steps' and the decode steps' median ms."""
    prompts = Prompts(cfg, seed=7)
    base = prompts.request(context, 4, name="warm")
    engine.add(engine.make_sequence(base))
    while engine.has_work() and any(s.request_id.startswith("warm") for s in engine.scheduler.waiting):
        engine.step()
    mixed, decode = [], []
    s = SamplingSettings(max_new_tokens=64, min_new_tokens=64, seed=0)

    def join(name: str) -> None:
        ids = base.text_ids[: context - positions] + prompts.request(positions, 4).text_ids
        engine.add(engine.make_sequence(GenerationRequest(name, s, ChunkSettings(), text_ids=ids)))

    config = engine.config
    engine.config = dataclasses.replace(config, overlap=False)  # each step() then runs exactly one step
    for j in range(joins):
        join(f"join{j}")
        for _ in range(6):
            ms = timed_step(engine, torch.device("cuda")) * 1e3
            (mixed if engine.last_step.prefill_tokens else decode).append(ms)
    kernels = {"mixed": defaultdict(lambda: [0, 0.0]), "decode": defaultdict(lambda: [0, 0.0])}  # profiled apart
    counts = {"mixed": 0, "decode": 0}
    for j in range(3):
        join(f"profiled{j}")
        for _ in range(2):  # the mixed step, then a decode step
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                engine.step()
                torch.cuda.synchronize()
            kind = "mixed" if engine.last_step.prefill_tokens else "decode"
            counts[kind] += 1
            cuda_kernels(prof, kernels[kind])
    engine.config = config

    def med(xs):
        return statistics.median_high(xs) if xs else float("nan")
    per_step = {kind: {k: us / max(counts[kind], 1) for k, (_, us) in kernels[kind].items()} for kind in kernels}
    return {"mixed": mixed, "decode": decode, "mixed_ms": med(mixed), "decode_ms": med(decode), "kernels_us": per_step}


def print_join_kernels(join: dict, top: int) -> None:
    """The kernels of a mixed step against a decode step's, largest difference first."""
    mixed, decode = join["kernels_us"]["mixed"], join["kernels_us"]["decode"]
    print(f"  kernels: mixed {sum(mixed.values()) / 1e3:.2f} ms, decode {sum(decode.values()) / 1e3:.2f} ms a step")
    print(f"  {'kernel':70s} {'mixed us':>9s} {'decode us':>9s}")
    for name in sorted(set(mixed) | set(decode), key=lambda k: -abs(mixed.get(k, 0) - decode.get(k, 0)))[:top]:
        print(f"  {name[:70]:70s} {mixed.get(name, 0.0):9.1f} {decode.get(name, 0.0):9.1f}")


if __name__ == "__main__":
    main()
