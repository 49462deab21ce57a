"""The llm's decode attention against its floor: one layer's call at the real shape (32 query heads, 8 KV heads of
128, bf16, the paged pool), replayed 36 times from a CUDA graph (the audio path's layers), for each batch and
context, by variant (slices a sequence, key tile, warps, pipeline stages). The floor is the KV bytes a step reads
at this process's copy bandwidth; run it as an MPS client to see the stack's share:

    python bench/llm_attention.py --batches 1,8,16,32,64 --contexts 256,512,1024
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 python bench/llm_attention.py ...   (under an MPS daemon)

Prints a table (us per step of 36 calls, and x the floor) and writes JSON.
"""

from __future__ import annotations

import argparse
import json

import torch
from llm_floor import copy_bandwidth

from measure import gpu_record, graph_time
from services.llm.runner.kernels.paged_attention import MAX_SLICES, decode_slices, paged_decode_attention

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


def case(batch: int, context: int, device, gen):
    """A pool holding `batch` sequences of `context` positions in shuffled blocks, and one step's queries."""
    per_seq = -(-context // BLOCK_SIZE)
    blocks = batch * per_seq
    kv = torch.randn(blocks, 1, 2, KV_HEADS, BLOCK_SIZE, HEAD_DIM, generator=gen, device=device).to(torch.bfloat16)
    tables = torch.randperm(blocks, generator=gen, device=device).to(torch.int32).view(batch, per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen, device=device).to(torch.bfloat16)
    return q, kv, tables, lens


def step_seconds(q, kv, tables, lens, slices: int, tiles: dict, reps: int) -> tuple[float, torch.Tensor]:
    """Median seconds of LAYERS calls replayed from one graph, and the call's output."""
    out = torch.empty_like(q)

    def call():
        paged_decode_attention(q, kv, 0, tables, lens, HEAD_DIM**-0.5, out=out, slices=slices, tiles=tiles)

    return graph_time(call, LAYERS, reps, q.device), out.clone()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,8,16,32,64")
    p.add_argument("--contexts", default="256,512,1024")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", default="llm_attention.json")
    args = p.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    bandwidth = copy_bandwidth(device)
    record = gpu_record(bench="llm_attention", copy_bandwidth=bandwidth, args=vars(args))
    names = args.variants.split(",")
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
