"""gRPC aio on loopback: writes to a stream-stream call made around its deadline, and the status each failure leaves on
the call (issue 23: tests/test_load_cleanup.py's flake). 2026-11-28, grpcio 1.85.3, the 2-core development machine:

    .venv/bin/python docs/results/deadline_write_2026-11-28/race.py
    left at INTERNAL: max -0.001656 min -0.003485   (the deadline had passed at every INTERNAL)
    2857 ('AioRpcError', 'StatusCode.DEADLINE_EXCEEDED', 'Deadline Exceeded')
    98 ('InvalidStateError', 'StatusCode.DEADLINE_EXCEEDED', 'Deadline Exceeded')
    45 ('AioRpcError', 'StatusCode.INTERNAL', 'Internal error from Core')

The 45: the call's own status is core's bare INTERNAL, which the gateway read as a broken stream (a vocoder gone) and
so marked a healthy replica down; services/gateway/pipeline.py's Turn._stage_error now asks the turn's clock first.
"""

import asyncio
import collections
import time

import grpc


async def handler(request_iterator, context):
    async for _ in request_iterator:
        pass
    await asyncio.sleep(10)
    yield b""


async def main():
    server = grpc.aio.server()
    rpc = grpc.stream_stream_rpc_method_handler(handler)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {"M": rpc}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    method = channel.stream_stream("/t.S/M", request_serializer=None, response_deserializer=None)
    seen, left = collections.Counter(), []
    for i in range(3000):
        timeout = 0.002 + (i % 20) * 0.0005
        sent = time.perf_counter()
        call = method(timeout=timeout)
        await asyncio.sleep(timeout * 0.9 + (i % 7) * 0.0002)  # the write lands around the deadline
        try:
            await call.write(b"x")
            await call.read()
            seen["ok"] += 1
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            code = await asyncio.wait_for(call.code(), 1)
            details = await call.details()
            seen[(type(err).__name__, str(code), details)] += 1
            if details == "Internal error from Core":
                left.append(sent + timeout - time.perf_counter())
    print("left at INTERNAL: max %.6f min %.6f" % (max(left), min(left)))
    for key, count in seen.most_common():
        print(count, key)
    await server.stop(None)


asyncio.run(main())
