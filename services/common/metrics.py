"""What every service's metrics.py shares: the latency buckets of docs/architecture.md §6 and the
/metrics HTTP endpoint. Only the metrics modules import prometheus_client."""

from __future__ import annotations

from prometheus_client import start_http_server

# Seconds; fine below 100 ms, where time to first audio is decided.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0,
)
COUNT_BUCKETS = (1, 2, 3, 4, 5, 8, 10, 16, 20, 32, 48, 64, 96, 128, 256)
RATIO_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


def start_metrics_server(host: str, port: int) -> None:
    """Serve /metrics over HTTP on a daemon thread (port 0 disables it)."""
    if port:
        try:
            start_http_server(port, addr=host)
        except OSError as e:
            raise OSError(f"cannot serve /metrics on {host}:{port}: {e.strerror or e}") from e
