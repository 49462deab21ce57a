"""The llm benchmark's report (bench/llm_report.py): the roofline beside the cuBLAS floor, the larger of a step's
bytes over the copy bandwidth and its FLOPs over the matrix rate; none on a CPU run (no rate measured)."""

from __future__ import annotations

import pytest

from bench.llm_report import build_rows


def result(rate: float | None) -> dict:
    return {"copy_bandwidth_bytes_per_s": 4e12, "audio_kv_bytes_per_position": 1e5, "audio_path_weight_bytes": 14e9,
            "audio_path_params": 7e9, "attention_flops_per_pair": 1e6, "bf16_matmul_flops_per_s": rate,
            "prefill_lengths": [512], "contexts": [512], "batches": [1],
            "ours": {"prefill": {"512": {"ms": 12.0}}, "decode": {"1x512": {"ms": 5.0, "attended_positions_per_step": 513}}},
            "gemm_floor_ms": {"512": 10.0, "1": 4.2}, "peer": {}, "skipped": {}, "errors": {}}


def test_decode_at_batch_1_is_bound_by_its_bytes_and_a_prefill_by_its_flops():
    decode, prefill = (next(r for r in build_rows(result(8e14)) if r["kind"] == kind) for kind in ("decode", "prefill"))
    # decode: the weights and 513 positions' K/V over 4 TB/s (its 14e9 + 513 x 2e6 FLOPs take 0.018 ms at 8e14)
    assert decode["roofline_ms"] == pytest.approx((14e9 + 513e5) / 4e12 * 1e3)
    assert decode["ours_over_roofline"] == pytest.approx(5.0 / decode["roofline_ms"])
    # prefill 512: 2 x 7e9 x 512 FLOPs and 512 x 513 / 2 causal pairs over 8e14 (its bytes take 3.5 ms)
    assert prefill["roofline_ms"] == pytest.approx((2 * 7e9 * 512 + 1e6 * 512 * 513 / 2) / 8e14 * 1e3)
    assert decode["roofline_ms"] < decode["floor_ms"] and prefill["roofline_ms"] < prefill["floor_ms"]


def test_no_rate_no_roofline():
    assert all(r["roofline_ms"] is None and r["ours_over_roofline"] is None for r in build_rows(result(None)))
