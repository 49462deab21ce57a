"""Triton GPU kernels for the runner: paged attention over the shared KV pool (docs/architecture.md §3)."""
