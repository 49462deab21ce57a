"""How fast a full gateway refuses a burst, against gRPC Python's own floor (every refusal within 50 ms).

A burst of N Synthesize calls sent at once from one client process, each timed from sending to its status, as
`moss-serve bench` times refusals. Side by side, from the same client:
- floor: a bare grpc.aio server (its own process) whose Synthesize refuses at once, RESOURCE_EXHAUSTED with a hint:
  what any Python gRPC service pays for N calls arriving together;
- gateway: --target, a gateway made full first: --hold calls that stay running (long replies, read as they come)
  take its places, so that every call of the burst is refused by admission.
The two take their bursts in turn while the held calls play, so that the floor meets the same busy machine (on a
2-core machine whose stages play 4 turns, the floor's p95 for 96 is 30-46 ms, against 15-28 ms idle: 2026-11-30).

    python3 bench/refusal_floor.py --burst 128 --reps 3 [--target HOST:PORT --hold 4] [--json out.json]

Prints a table (slowest, p95, p50 of each burst) and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import grpc

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "protos")]
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc  # noqa: E402

from services.stack import free_port  # noqa: E402


class Refuser(gateway_pb2_grpc.GatewayServicer):
    async def Synthesize(self, request, context):
        context.set_trailing_metadata((("retry-after-ms", "1000"),))
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "every place is taken")
        yield  # (a generator: a server-streaming method)


def serve_floor(port: int, ready) -> None:
    async def main():
        server = grpc.aio.server()
        gateway_pb2_grpc.add_GatewayServicer_to_server(Refuser(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()
    asyncio.run(main())


def request(tokens: int) -> gateway_pb2.SynthesizeRequest:
    return gateway_pb2.SynthesizeRequest(text="How fast is a refusal?",
                                         sampling=common_pb2.SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens))


async def one(stub, tokens: int) -> tuple[str, float]:
    """→ (status code name, seconds from sending to the status or the last message)."""
    sent = time.perf_counter()
    try:
        async for _ in stub.Synthesize(request(tokens), timeout=120):
            pass
        return "OK", time.perf_counter() - sent
    except grpc.aio.AioRpcError as err:
        hint = dict(err.trailing_metadata() or ()).get("retry-after-ms")
        code = err.code().name + ("" if hint is None or err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED else "+hint")
        if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            code += f" ({err.details()})"
        return code, time.perf_counter() - sent


async def burst_once(stub, burst: int) -> dict:
    results = await asyncio.gather(*(one(stub, 8) for _ in range(burst)))
    refused = sorted(s for code, s in results if code.startswith("RESOURCE_EXHAUSTED"))
    return {"burst": burst, "refused": len(refused),
            "with_hint": sum(code == "RESOURCE_EXHAUSTED+hint" for code, _ in results),
            "other": sorted({code for code, _ in results if not code.startswith("RESOURCE_EXHAUSTED")}),
            "p50_ms": 1e3 * statistics.median(refused) if refused else None,
            "p95_ms": 1e3 * refused[min(len(refused) - 1, int(0.95 * len(refused)))] if refused else None,
            "max_ms": 1e3 * refused[-1] if refused else None}


async def bursts(targets: dict[str, str], burst: int, reps: int, hold: int) -> dict[str, list[dict]]:
    """name → address: each takes a burst in turn, `reps` rounds. With `hold`, the last target (the gateway) is made
    full first by that many long calls, which play throughout: the floor's bursts then meet the same busy machine."""
    out: dict[str, list[dict]] = {name: [] for name in targets}
    channels = {name: grpc.aio.insecure_channel(address) for name, address in targets.items()}
    try:
        stubs = {name: gateway_pb2_grpc.GatewayStub(channel) for name, channel in channels.items()}
        for stub in stubs.values():
            await one(stub, 8)  # each channel connected
        held = list(stubs.values())[-1]
        holders = [asyncio.create_task(one(held, 500)) for _ in range(hold)]  # 40 s replies, read as they come
        await asyncio.sleep(3.0 if hold else 0.0)  # they are running
        for _ in range(reps):
            for name, stub in stubs.items():
                out[name].append(await burst_once(stub, burst))
                await asyncio.sleep(1.0)
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    finally:
        for channel in channels.values():
            await channel.close()
    return out


def fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--burst", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--target", help="a gateway (made full by --hold calls first); default: the floor only")
    p.add_argument("--hold", type=int, default=4, help="long calls that take the gateway's places first")
    p.add_argument("--json")
    args = p.parse_args()

    port, ready = free_port(), multiprocessing.Event()
    floor = multiprocessing.Process(target=serve_floor, args=(port, ready), daemon=True)
    floor.start()
    ready.wait(30)
    targets = {"floor (bare grpc.aio)": f"127.0.0.1:{port}"}
    if args.target:
        targets[f"gateway {args.target}"] = args.target
    rows = asyncio.run(bursts(targets, args.burst, args.reps, args.hold if args.target else 0))
    floor.terminate()

    print(f"\nA burst of {args.burst} calls at once, one client process; each burst's refusals, sending to status (ms):\n")
    print("| server | burst | refused (with hint) | p50 | p95 | slowest | other codes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, reps in rows.items():
        for k, r in enumerate(reps, 1):
            print(f"| {name} | {k} | {r['refused']} ({r['with_hint']}) | {fmt(r['p50_ms'])} | {fmt(r['p95_ms'])} | "
                  f"{fmt(r['max_ms'])} | {', '.join(r['other']) or '-'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
