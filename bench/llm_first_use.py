"""Steps that pay a first-use cost after the llm's warm-up (issue 9).

Streams join a batch that is already decoding, k at a time, as they do in service; each composition runs
twice. A step much slower the first time than the second is a first use the warm-up missed (a kernel
compiled or loaded, a code path run for the first time): in service it stalls every stream in the batch.
Built like the llm service builds its engine (random weights at the preset's dimensions), with the bench's
built-in prompts.

    python bench/llm_first_use.py --preset moss-speech --device cuda --json out.json
    python bench/llm_first_use.py --preset moss-speech --device cuda --no-staggered   # the warm-up without joins
"""

from __future__ import annotations

import argparse
import json
import time

from services.bench.workload import load_prompts
from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import GenerationRequest
from services.llm.engine.warmup import ROUNDS, STAGGERED, warm_up
from services.llm.server import build_engine
from services.llm.settings import LlmSettings

JOINS = (1, 2, 3, 5, 7, 13, 14, 17, 24, 31, 47, 64, 100)


def join(engine, prompts, base: int, k: int, tag: str) -> float:
    """`base` streams decode, then k join → the slowest step until every joiner has its first token (s)."""
    long = SamplingSettings(max_new_tokens=400, min_new_tokens=400, seed=0)
    def add(i, s):
        engine.add(engine.make_sequence(GenerationRequest(f"{tag}-{i}", s, ChunkSettings(), text=prompts[i % len(prompts)])))

    for i in range(base):
        add(i, long)
    for _ in range(4):
        engine.step()
    joiners = set(engine.sequences)
    for i in range(k):
        add(base + i, long)
    joiners = set(engine.sequences) - joiners
    slowest = 0.0
    while any(engine.sequences[s].first_token is None for s in joiners):
        t = time.perf_counter()
        engine.step()
        slowest = max(slowest, time.perf_counter() - t)
    for seq_id in list(engine.sequences):
        engine.abort(seq_id)
    while engine.has_work():
        engine.step()
    return slowest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--kv-cache-gb", type=float, default=32.0)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--no-staggered", action="store_true", help="warm up without the staggered joins")
    p.add_argument("--json")
    args = p.parse_args()
    engine = build_engine(LlmSettings(preset=args.preset, device=args.device, kv_cache_gb=args.kv_cache_gb,
                                      max_num_seqs=args.max_num_seqs))
    started = time.perf_counter()
    warm_up(engine, ROUNDS, () if args.no_staggered else STAGGERED)
    warm = time.perf_counter() - started
    prompts = load_prompts(None)
    rows = []
    for base in (1, 8):
        for k in JOINS:
            first = join(engine, prompts, base, k, f"a{base}-{k}")
            again = join(engine, prompts, base, k, f"b{base}-{k}")
            rows.append({"decoding": base, "joining": k, "first_ms": first * 1e3, "again_ms": again * 1e3})
    print(f"warm-up {'without' if args.no_staggered else 'with'} staggered joins: {warm:.1f} s")
    print("| decoding | joining | slowest step, first time | again |\n| --- | --- | --- | --- |")
    for r in rows:
        flag = " **" if r["first_ms"] > 2 * r["again_ms"] + 20 else ""
        print(f"| {r['decoding']} | {r['joining']} | {r['first_ms']:.1f} ms{flag} | {r['again_ms']:.1f} ms |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"staggered": not args.no_staggered, "warm_up_seconds": warm, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
