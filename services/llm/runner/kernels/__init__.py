"""Triton GPU kernels for the runner: paged attention over the shared KV pool (shared/DESIGN.md §3)."""
