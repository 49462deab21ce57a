"""The HTTP door against gRPC on one stack: time to the first audio byte at the client, side by side.

Each round sends the same seeded turn through gRPC's Synthesize, then POST /v1/audio/speech as pcm, as wav and as
sse, one at a time, and takes the time from sending to the first audio byte (gRPC: the first AudioChunk; HTTP: the
first body byte that is audio; sse: the first delta event). The ratio to gRPC is the HTTP door's own cost: its
JSON parsing, aiohttp, the encoder, chunked transfer.

    python bench/http_ttfb.py --rounds 20 --json http_ttfb.json          # starts a tiny CPU stack of its own
    python bench/http_ttfb.py --gateway 127.0.0.1:50051 --http 127.0.0.1:8000   # a running stack (moss-serve up)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import time

import httpx2 as httpx
import numpy as np

from services.gateway.client import synthesize

TEXT = "Hello there, how are you today?"
# One HTTP client made beforehand (making one builds an SSL context: ~40 ms that is the client's, not the door's), with
# no kept connections: each request connects anew, as each gRPC call here opens its own channel.
CLIENT = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))
SAMPLING = {"max_new_tokens": 24, "min_new_tokens": 24, "seed": 3}


def grpc_ttfa(target: str) -> float:
    from moss.speech.v1 import common_pb2

    result = asyncio.run(synthesize(target, TEXT, sampling=common_pb2.SamplingParams(**SAMPLING)))
    return result.client_ttfa


def http_ttfb(base: str, response_format: str, stream_format: str = "audio") -> float:
    body = {"model": "moss-speech", "voice": "default", "input": TEXT, "response_format": response_format,
            "stream_format": stream_format, "sampling": SAMPLING}
    header = 44 if response_format == "wav" else 0  # a WAV's header goes out with its first samples
    start = time.perf_counter()
    with CLIENT.stream("POST", base + "/v1/audio/speech", json=body) as r:
        r.raise_for_status()
        seen = 0
        if stream_format == "sse":
            for line in r.iter_lines():
                if line.startswith("data: ") and "speech.audio.delta" in line:
                    return time.perf_counter() - start
        for chunk in r.iter_bytes():
            seen += len(chunk)
            if seen > header:
                return time.perf_counter() - start
    raise RuntimeError("no audio came")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--gateway", help="gRPC HOST:PORT of a running stack (default: start a tiny CPU stack)")
    p.add_argument("--http", help="HTTP HOST:PORT of that stack's gateway")
    p.add_argument("--json")
    args = p.parse_args()
    stack = None
    if args.gateway:
        target, base = args.gateway, f"http://{args.http}"
    else:
        from services.stack import NO_SPEECH, Ports, Stack

        ports = Ports.free(http=True)
        stack = Stack(ports, without=NO_SPEECH)
        stack.start_all()
        target, base = stack.target("gateway"), f"http://127.0.0.1:{ports.http}"
    try:
        variants = {"gRPC Synthesize": lambda: grpc_ttfa(target), "HTTP pcm": lambda: http_ttfb(base, "pcm"),
                    "HTTP wav": lambda: http_ttfb(base, "wav"), "HTTP sse (pcm)": lambda: http_ttfb(base, "pcm", "sse")}
        for run in variants.values():  # warm-up
            run()
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, run in variants.items():
                times[name].append(run())
    finally:
        if stack is not None:
            stack.stop(*list(stack.procs))
    base_p50 = statistics.median(times["gRPC Synthesize"])
    rows = []
    print(f"{'door':<18}{'p50 ms':>9}{'p95 ms':>9}{'x gRPC p50':>12}")
    for name, values in times.items():
        p50, p95 = statistics.median(values) * 1e3, float(np.percentile(values, 95)) * 1e3
        rows.append({"door": name, "p50_ms": p50, "p95_ms": p95, "x_grpc": p50 / (base_p50 * 1e3)})
        print(f"{name:<18}{p50:>9.1f}{p95:>9.1f}{p50 / (base_p50 * 1e3):>12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.datetime.now().isoformat(timespec="seconds"), "rounds": args.rounds,
                       "sampling": SAMPLING, "rows": rows, "raw_seconds": times}, f, indent=2)


if __name__ == "__main__":
    main()
