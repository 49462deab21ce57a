"""Shared fixtures: tiny models built here (random weights, real key names), and the three services
as real processes on free loopback ports."""

from __future__ import annotations

import re
import urllib.request

import pytest

from services.stack import Ports, Stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """llm + vocoder + gateway on the tiny presets, shared by the tests that only send requests."""
    with Stack(Ports.free(), log_dir=tmp_path_factory.mktemp("stack-logs")) as s:
        yield s


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric_value(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    pattern = rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$" if labels else rf"^{re.escape(name)} ([0-9.e+-]+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0
