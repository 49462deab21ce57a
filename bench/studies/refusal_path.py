"""The gateway's own work for one refused Synthesize, without gRPC's (every refusal within 50 ms).

A burst of 128 refusals is served one after another on the gateway's event loop, so each one's work delays the last.
`bench/refusal_floor.py` times whole bursts against a bare grpc.aio server, where gRPC's own per-call work dominates
(~0.2-0.5 ms a call). This bench isolates what is ours: a refused call run through the gateway's real path (the
error interceptor with the gateway's write timeout, the servicer, the turn, admission with every place taken) with a
stand-in for gRPC's servicer context, against the bare server's handler (set a hint, abort) run the same way.

    python3 bench/studies/refusal_path.py [--calls 20000] [--reps 5] [--json out.json]

Prints a table (microseconds a refusal, the median of the reps) and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import bench_path  # noqa: F401  (bench/ and the tree on the import path)
import grpc

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "protos")]
from moss.speech.v1 import common_pb2, gateway_pb2  # noqa: E402

from services.common.interceptor import ErrorInterceptor  # noqa: E402
from services.gateway import metrics  # noqa: E402
from services.gateway.admission import Admission  # noqa: E402
from services.gateway.backends import Backends  # noqa: E402
from services.gateway.servicer import GatewayServicer  # noqa: E402
from services.gateway.speech import Speech  # noqa: E402
from services.gateway.turn_request import TurnLimits  # noqa: E402

METHOD = "/moss.speech.v1.Gateway/Synthesize"
REQUEST = gateway_pb2.SynthesizeRequest(text="How fast is a refusal?", sampling=common_pb2.SamplingParams(max_new_tokens=8))


class Context:
    """What the path uses of grpc.aio.ServicerContext, and nothing more."""

    def __init__(self):
        self.status = None

    def peer(self):
        return "ipv4:127.0.0.1:50123"

    def invocation_metadata(self):
        return (("user-agent", "grpc-python-asyncio"),)

    def time_remaining(self):
        return 30.0

    def set_code(self, code):
        self.status = code

    def code(self):
        return self.status

    def set_details(self, details):
        self.details = details

    def set_trailing_metadata(self, metadata):
        self.trailing = metadata

    async def abort(self, code, details="", trailing_metadata=()):
        self.status, self.details, self.trailing = code, details, trailing_metadata
        raise grpc.aio.AbortError()


class Details:
    method, invocation_metadata = METHOD, ()


def gateway_call():
    """→ one refused call through the gateway's path (an async function of no arguments)."""
    backends = Backends(["127.0.0.1:1"], ["127.0.0.1:2"], 0.1, None, 5.0)  # never reached: the turn is refused first
    admission = Admission(4, 0)
    admission.running = admission.max_turns  # every place taken, no queue
    servicer = GatewayServicer(Speech(backends, TurnLimits(4000, 2000, 60.0), admission), 60.0)
    registered = grpc.unary_stream_rpc_method_handler(servicer.Synthesize)
    interceptor = ErrorInterceptor(metrics.observe_request, 10.0, metrics.observe_stalled)  # the gateway's

    async def continuation(details):
        return registered

    async def one():
        handler = await interceptor.intercept_service(continuation, Details())
        context = Context()
        try:
            await handler.unary_stream(REQUEST, context)  # (with a write timeout the handler is a coroutine)
        except grpc.aio.AbortError:
            pass
        if context.status != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise RuntimeError(f"not refused: {context.status}")
    return one


def bare_call():
    """→ one call of the bare server's handler (bench/refusal_floor.py's Refuser)."""
    async def synthesize(request, context):
        context.set_trailing_metadata((("retry-after-ms", "1000"),))
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "every place is taken")
        yield

    async def one():
        context = Context()
        try:
            async for _ in synthesize(REQUEST, context):
                pass
        except grpc.aio.AbortError:
            pass
    return one


async def time_calls(one, calls: int, reps: int) -> list[float]:
    await one()  # first call: imports, the handler's wrapping
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            await one()
        out.append((time.perf_counter() - start) / calls * 1e6)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args()

    async def run():
        return {"gateway path": await time_calls(gateway_call(), args.calls, args.reps),
                "bare handler": await time_calls(bare_call(), args.calls, args.reps)}

    results = asyncio.run(run())
    print(f"A refused Synthesize, in process, {args.calls} calls x {args.reps} reps (us a call):\n")
    print("| path | median | reps |")
    print("| --- | --- | --- |")
    for name, us in results.items():
        print(f"| {name} | {statistics.median(us):.1f} | {', '.join(f'{u:.1f}' for u in us)} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
                                               "python": sys.version.split()[0], "us_a_call": results}, indent=2))


if __name__ == "__main__":
    main()
