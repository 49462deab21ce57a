"""How long the llm's real weights take to load: a safetensors file of --gib GiB (bf16 matrices of the llm's layer
shapes) written to --dir, then read as services/llm/model/checkpoint.py reads one (safe_open on the device, each
tensor taken), from a cold page cache (the file's pages dropped first: posix_fadvise, no root needed) and from a warm
one. The 18 GB checkpoint's time is the measured rate times 18 GB.

    python3 bench/studies/weights_load.py --gib 2 --dir /models --device cuda [--json out.json]

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

CHECKPOINT_GB = 18.0  # MOSS-Speech's 9.1 B parameters in bf16
SHAPE = (4096, 12288)  # a layer's MLP matrix: 96 MiB in bf16


def write(path: Path, gib: float) -> int:
    """A safetensors file of ~gib GiB of bf16 matrices → its size in bytes."""
    per = SHAPE[0] * SHAPE[1] * 2
    n = max(1, round(gib * (1 << 30) / per))
    save_file({f"layers.{i}.mlp.weight": torch.randn(SHAPE).to(torch.bfloat16) for i in range(n)}, str(path))
    return path.stat().st_size


def drop_cache(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def read(path: Path, device: str) -> float:
    """Seconds to take every tensor onto `device`, as the llm's loader does (on a CPU a tensor is a view of the
    mapped file until read: each is copied here, so that every page is read)."""
    start = time.perf_counter()
    with safe_open(str(path), framework="pt", device=device) as f:
        for key in f.keys():
            t = f.get_tensor(key)
            if t.device.type == "cpu":
                t.clone()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--dir", default=None, help="where to write the file (the disk the weights live on; default: a temp dir)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "model.safetensors"
        size = write(path, args.gib)
        rows = []
        for cache in ("cold", "warm"):
            for _ in range(args.reps):
                if cache == "cold":
                    drop_cache(path)
                seconds = read(path, args.device)
                rows.append({"cache": cache, "bytes": size, "seconds": seconds, "gb_per_s": size / seconds / 1e9,
                             "checkpoint_seconds": CHECKPOINT_GB * 1e9 / (size / seconds)})
    print(f"{'page cache':10s} {'GB':>6s} {'seconds':>8s} {'GB/s':>6s} {'18 GB would take':>17s}")
    for r in rows:
        print(f"{r['cache']:10s} {r['bytes'] / 1e9:6.2f} {r['seconds']:8.2f} {r['gb_per_s']:6.2f} {r['checkpoint_seconds']:15.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "dir": args.dir, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
