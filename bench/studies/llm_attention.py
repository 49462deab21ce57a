"""The llm's decode attention against its floor: one layer's call at the real shape (32 query heads, 8 KV heads of
128, bf16, the paged pool), replayed 36 times from a CUDA graph (the audio path's layers), for each batch and
context, by variant (slices a sequence, key tile, warps, pipeline stages). The floor is the KV bytes a step reads
at this process's copy bandwidth; run it as an MPS client to see the stack's share:

    python bench/studies/llm_attention.py --batches 1,8,16,32,64 --contexts 256,512,1024
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 python bench/studies/llm_attention.py ...   (under an MPS daemon)

With --packed N, the mixed step's attention instead: B decode rows and one turn's N new rows in one packed prefill
call, padded as a graph pads it (rows to the runner's bucket, sequences to --max-num-seqs), by query tile
(`prefill_block_m`'s choice, 16, 32, 64 rows).

Prints a table (us per step of 36 calls, and x the floor) and writes JSON.
"""

from __future__ import annotations

import argparse
import json

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import torch
from llm_floor import copy_bandwidth

from measure import gpu_record, graph_time
from services.llm.runner.kernel_runner import packed_buckets
from services.llm.runner.kernels.paged_attention import (
    MAX_SLICES,
    decode_slices,
    paged_decode_attention,
    paged_prefill_attention,
)

LAYERS = 36  # the audio path: 32 shared + 4 audio layers, each one decode attention
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16

# name → (slices for a batch, tiles); "defaults" is what the runner runs
VARIANTS = {
    "defaults": (lambda b: decode_slices(b, KV_HEADS), {}),
    "2x slices": (lambda b: min(MAX_SLICES, 2 * decode_slices(b, KV_HEADS)), {}),
    "4x slices": (lambda b: min(MAX_SLICES, 4 * decode_slices(b, KV_HEADS)), {}),
    "keys 32": (lambda b: decode_slices(b, KV_HEADS), {"BLOCK_N": 32}),
    "keys 32 + 2x slices": (lambda b: min(MAX_SLICES, 2 * decode_slices(b, KV_HEADS)), {"BLOCK_N": 32}),
    "3 stages": (lambda b: decode_slices(b, KV_HEADS), {"num_stages": 3}),
    "1 stage": (lambda b: decode_slices(b, KV_HEADS), {"num_stages": 1}),
    "2 warps": (lambda b: decode_slices(b, KV_HEADS), {"num_warps": 2}),
    "keys 32 + 2 warps + 2x slices": (lambda b: min(MAX_SLICES, 2 * decode_slices(b, KV_HEADS)), {"BLOCK_N": 32, "num_warps": 2}),
}


# name → the prefill call's tiles ({}: what the runner runs)
PACKED_VARIANTS = {"defaults": {}, "tile 16": {"BLOCK_M": 16}, "tile 32": {"BLOCK_M": 32}, "tile 64": {"BLOCK_M": 64}}


def pool(batch: int, context: int, device, gen):
    """A pool holding `batch` sequences of `context` positions in shuffled blocks → (kv, block tables)."""
    per_seq = -(-context // BLOCK_SIZE)
    blocks = batch * per_seq
    kv = torch.randn(blocks, 1, 2, KV_HEADS, BLOCK_SIZE, HEAD_DIM, generator=gen, device=device).to(torch.bfloat16)
    tables = torch.randperm(blocks, generator=gen, device=device).to(torch.int32).view(batch, per_seq)
    return kv, tables


def queries(rows: int, device, gen) -> torch.Tensor:
    return torch.randn(rows, HEADS, HEAD_DIM, generator=gen, device=device).to(torch.bfloat16)


def case(batch: int, context: int, device, gen):
    """A pool of `batch` sequences at `context`, and one decode step's queries."""
    kv, tables = pool(batch, context, device, gen)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return queries(batch, device, gen), kv, tables, lens


def graph_seconds(attend, q: torch.Tensor, reps: int) -> tuple[float, torch.Tensor]:
    """attend(out): one attention call writing `out` (shaped as q); → median seconds of LAYERS such calls replayed
    from one graph, and the call's output."""
    out = torch.zeros_like(q)
    return graph_time(lambda: attend(out), LAYERS, reps, q.device), out.clone()


def step_seconds(q, kv, tables, lens, slices: int, tiles: dict, reps: int) -> tuple[float, torch.Tensor]:
    return graph_seconds(lambda out: paged_decode_attention(q, kv, 0, tables, lens, HEAD_DIM**-0.5, out=out,
                                                            slices=slices, tiles=tiles), q, reps)


def packed_case(batch: int, context: int, new: int, max_num_seqs: int, device, gen):
    """`batch` decode rows at `context` and one sequence of `new` rows ending at `context`, as the runner packs a
    mixed step: rows padded to its bucket (slot -1), sequences to max_num_seqs (no rows, context 0)."""
    kv, tables = pool(batch + 1, context, device, gen)
    real = batch + new
    rows = next(b for b in packed_buckets(1 << 20) if b >= real)
    cu = list(range(batch + 1)) + [real] * (max_num_seqs - batch)
    lens = [context] * (batch + 1) + [0] * (max_num_seqs - batch - 1)
    padded_tables = torch.zeros(max_num_seqs, tables.shape[1], dtype=torch.int32, device=device)
    padded_tables[: batch + 1] = tables
    return (queries(rows, device, gen), kv, padded_tables, torch.tensor(cu, dtype=torch.int32, device=device),
            torch.tensor(lens, dtype=torch.int32, device=device), real)


def packed_seconds(q, kv, tables, cu, lens, tiles: dict, reps: int) -> tuple[float, torch.Tensor]:
    return graph_seconds(lambda out: paged_prefill_attention(q, kv, 0, tables, cu, lens, HEAD_DIM**-0.5, out=out,
                                                             tiles=tiles), q, reps)


def packed_main(args, device, gen, bandwidth, record):
    names = args.variants.split(",") if args.variants else list(PACKED_VARIANTS)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; a mixed step's attention (B decode rows + {args.packed} new rows, "
          f"padded to the bucket, {args.max_num_seqs} sequences): us per step of {LAYERS} calls, x the KV floor")
    print("| batch | context | rows (bucket) | floor | " + " | ".join(names) + " |")
    print("| --- " * (4 + len(names)) + "|")
    for batch in [int(b) for b in args.batches.split(",")]:
        for context in [int(c) for c in args.contexts.split(",")]:
            q, kv, tables, cu, lens, real = packed_case(batch, context, args.packed, args.max_num_seqs, device, gen)
            floor = LAYERS * (batch + 1) * context * 2 * KV_HEADS * HEAD_DIM * 2 / bandwidth
            cells, reference = [], None
            for name in names:
                seconds, out = packed_seconds(q, kv, tables, cu, lens, PACKED_VARIANTS[name], args.reps)
                out = out[:real]
                reference = out if reference is None else reference
                diff = float((out.float() - reference.float()).abs().max())
                record["cells"][f"{batch}+{args.packed}x{context} {name}"] = {"us": seconds * 1e6, "floor_us": floor * 1e6,
                                                                              "rows": q.shape[0], "max_diff": diff}
                cells.append(f"{seconds * 1e6:.0f} ({seconds / floor:.2f}x)" + ("" if diff < 2e-2 else " DIFFERS"))
            print(f"| {batch} | {context} | {real} ({q.shape[0]}) | {floor * 1e6:.0f} | " + " | ".join(cells) + " |",
                  flush=True)
            del q, kv, tables


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,8,16,32,64")
    p.add_argument("--contexts", default="256,512,1024")
    p.add_argument("--variants", default="", help="comma-separated (default: every variant of the mode)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", default="llm_attention.json")
    p.add_argument("--packed", type=int, default=0, help="time a mixed step's prefill call with this many new rows")
    p.add_argument("--max-num-seqs", type=int, default=256)
    args = p.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    bandwidth = copy_bandwidth(device)
    record = gpu_record(bench="llm_attention", copy_bandwidth=bandwidth, args=vars(args))
    if args.packed:
        packed_main(args, device, gen, bandwidth, record)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
        return
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write); us per step of {LAYERS} calls, x its floor")
    print("| batch | context | floor | " + " | ".join(names) + " |")
    print("| --- " * (3 + len(names)) + "|")
    for batch in [int(b) for b in args.batches.split(",")]:
        for context in [int(c) for c in args.contexts.split(",")]:
            q, kv, tables, lens = case(batch, context, device, gen)
            floor = LAYERS * batch * context * 2 * KV_HEADS * HEAD_DIM * 2 / bandwidth
            cells, reference = [], None
            for name in names:
                slices_of, tiles = VARIANTS[name]
                seconds, out = step_seconds(q, kv, tables, lens, slices_of(batch), tiles, args.reps)
                reference = out if reference is None else reference
                diff = float((out.float() - reference.float()).abs().max())
                record["cells"][f"{batch}x{context} {name}"] = {"us": seconds * 1e6, "floor_us": floor * 1e6,
                                                               "slices": slices_of(batch), "max_diff": diff}
                cells.append(f"{seconds * 1e6:.0f} ({seconds / floor:.2f}x)" + ("" if diff < 2e-2 else " DIFFERS"))
            print(f"| {batch} | {context} | {floor * 1e6:.0f} | " + " | ".join(cells) + " |", flush=True)
            del q, kv, tables, lens
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
