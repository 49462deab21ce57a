"""The engine: sequences, KV blocks, scheduling, sampling, sessions and the step loop. Plain Python and torch:
no gRPC, asyncio or Prometheus here."""
