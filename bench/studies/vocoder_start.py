"""Where a vocoder's start goes: imports, the models and voices, and each CUDA graph's capture, by kind and batch;
each graph captured with services/common/cuda_graph.py's `capture` (the allocator's caches kept) and, for a sample on
fresh copies, with `torch.cuda.graph` as it comes (the caches emptied before every capture), side by side.

    python3 bench/studies/vocoder_start.py --preset moss-speech --json start.json

The plan is the server's on a GPU at its defaults (server.graph_shapes: the flow's call limits, the first-chunk lane).
Prints a table and writes JSON.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
from collections import defaultdict  # noqa: E402

import torch  # noqa: E402

from services.vocoder import runner as runner_module  # noqa: E402
from services.vocoder.capture import split  # noqa: E402
from services.vocoder.codec import flow_graphs  # noqa: E402
from services.vocoder.loader import load_vocoder  # noqa: E402
from services.vocoder.runner import LAST_WINDOW_BATCH, smallest  # noqa: E402
from services.vocoder.streamer import DEFAULT_LOOKAHEAD  # noqa: E402
from services.vocoder.worker import FIRST_CHUNK_LANE_BATCH, FLOW_LIMITS  # noqa: E402

IMPORTED = time.perf_counter()


def torch_cuda_graph(fn, device=None, pool=None, warm_up=True):
    """The capture as `torch.cuda.graph` makes it (the caches emptied first), for the side-by-side column."""
    if warm_up:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def plan(v, lane, max_batch: int):
    """(kind, batch, capture) for every graph, as server.graph_shapes plans them, with their kinds."""
    ceiling = smallest(v.runner.batch_buckets, max_batch) or v.runner.batch_buckets[-1]
    batches = [b for b in v.runner.batch_buckets if b <= ceiling]
    voices = list(v.voices.values())
    left = v.receptive_field[0]
    out = [("generator", s) for s in v.runner.shapes(
        batches, exact_frames=[left + DEFAULT_LOOKAHEAD + f for f in v.end_frames],
        exact_batches=[b for b in batches if b <= LAST_WINDOW_BATCH])]
    out += [("flow", s) for s in v.decoder.shapes(voices, max_batch)]
    out += [("lane generator", s) for s in lane.runner.shapes([b for b in batches if b <= FIRST_CHUNK_LANE_BATCH])]
    out += [("lane flow", s) for s in lane.decoder.shapes(voices, FIRST_CHUNK_LANE_BATCH, first_calls=True)]
    return out


@torch.inference_mode()
def timed(shapes) -> list[tuple[str, int, float]]:
    rows = []
    for kind, s in shapes:
        began = time.perf_counter()
        s.capture()
        rows.append((kind, s.batch, time.perf_counter() - began))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="moss-speech")
    p.add_argument("--device", default="cuda", help="cpu: a dry run (no graphs)")
    p.add_argument("--sample", type=int, default=12, help="graphs of each kind captured the other way too")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    t = time.perf_counter()
    torch.ones(1, device=a.device).add_(1).item()
    cuda_init = time.perf_counter() - t
    t = time.perf_counter()
    v = load_vocoder(None, a.preset, a.device)
    loaded = time.perf_counter() - t
    lane = v.lane()
    shapes = plan(v, lane, FLOW_LIMITS.max_batch)
    first, _ = split([s for _, s in shapes])
    first_ids = {id(s) for s in first}
    rows = timed(shapes)
    # A sample of each kind again on fresh graphs (a lane's copy: the same models), both ways, kernels now warm.
    def sample():
        out = defaultdict(list)
        for kind, s in plan(v.lane(), lane.lane(), FLOW_LIMITS.max_batch):
            if len(out[kind]) < a.sample:
                out[kind].append((kind, s))
        return [x for xs in out.values() for x in xs]

    again = timed(sample())
    runner_module.capture, flow_graphs.capture = torch_cuda_graph, torch_cuda_graph
    theirs = timed(sample())
    ours_by = defaultdict(list)
    for kind, b, sec in rows:
        ours_by[kind].append(sec)
    again_by, theirs_by = defaultdict(list), defaultdict(list)
    for kind, b, sec in again:
        again_by[kind].append(sec)
    for kind, b, sec in theirs:
        theirs_by[kind].append(sec)
    first_seconds = sum(sec for (kind, s), (_, _, sec) in zip(shapes, rows) if id(s) in first_ids)
    report = dict(imports_s=IMPORTED - STARTED, cuda_init_s=cuda_init, load_s=loaded, graphs=len(rows),
                  captures_s=sum(r[2] for r in rows), first_graphs=len(first_ids), first_s=first_seconds,
                  by_kind={k: dict(graphs=len(xs), seconds=sum(xs), mean_ms=1e3 * sum(xs) / len(xs),
                                   sample_ms_ours=1e3 * sum(again_by[k]) / max(len(again_by[k]), 1),
                                   sample_ms_torch_cuda_graph=1e3 * sum(theirs_by[k]) / max(len(theirs_by[k]), 1))
                           for k, xs in ours_by.items()},
                  per_graph=[dict(kind=k, batch=b, seconds=sec) for k, b, sec in rows],
                  gpu=torch.cuda.get_device_name() if a.device == "cuda" else a.device, torch=torch.__version__)
    print(f"imports {report['imports_s']:.1f} s, CUDA init {cuda_init:.1f} s, models and voices {loaded:.1f} s")
    print(f"{len(rows)} graphs in {report['captures_s']:.1f} s; before serving (batch 1): {len(first_ids)} in "
          f"{first_seconds:.1f} s")
    print("| kind | graphs | seconds | ms a graph | {0} again: ours | {0} again: torch.cuda.graph |".format(a.sample))
    print("| --- | --- | --- | --- | --- | --- |")
    for k, d in report["by_kind"].items():
        print(f"| {k} | {d['graphs']} | {d['seconds']:.1f} | {d['mean_ms']:.0f} | {d['sample_ms_ours']:.0f} | "
              f"{d['sample_ms_torch_cuda_graph']:.0f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
