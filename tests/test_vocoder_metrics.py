"""The vocoder's call metrics (services/vocoder/metrics.py): every call in vocoder_batch_*, the first-chunk lane's
apart, and the main worker's by their windows, which bench/overload_report.py reads as each class's mean call."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from services.vocoder import metrics


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("windows,size", [(1, "1-4"), (4, "1-4"), (5, "5-8"), (8, "5-8"), (9, "9-16"), (16, "9-16"),
                                          (17, "17-32"), (32, "17-32"), (33, "33+"), (128, "33+")])
def test_a_call_falls_in_the_class_of_its_windows(windows, size):
    assert metrics.call_size(windows) == size


def test_the_main_workers_calls_are_counted_by_windows_and_the_lanes_are_not():
    names = ("vocoder_batch_seconds_count", "vocoder_lane_batch_seconds_count")
    before = {n: value(n) for n in names}
    by_size = {size: (value("vocoder_call_seconds_by_windows_count", windows=size),
                      value("vocoder_call_seconds_by_windows_sum", windows=size)) for _, size in metrics.CALL_SIZES}
    metrics.observe_batch(12, 0.25)
    metrics.observe_lane_batch(2, 0.5)
    assert {n: value(n) - before[n] for n in names} == {names[0]: 2, names[1]: 1}
    for _, size in metrics.CALL_SIZES:
        count, seconds = by_size[size]
        grew = (value("vocoder_call_seconds_by_windows_count", windows=size) - count,
                value("vocoder_call_seconds_by_windows_sum", windows=size) - seconds)
        assert grew == ((1, 0.25) if size == "9-16" else (0, 0)), size
