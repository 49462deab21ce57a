"""Static checks of the Grafana provisioning and the TTFA dashboard: every query is of a metric a service
declares, every stage and subject has its panel, and the TTFA quantiles are Prometheus's recording rules."""

from __future__ import annotations

import json
import re

import pytest
from test_deploy import DEPLOY, MOSS_SERVICES, ROOT, load_yaml

METRIC_IN_EXPR = re.compile(r"\b((?:gateway|llm|vocoder|encoder)_[A-Za-z0-9_]*[A-Za-z0-9])\b")
QUOTED_METRIC = re.compile(r"""["']((?:gateway|llm|vocoder|encoder)_[A-Za-z0-9_]+)["']""")
SERIES_SUFFIXES = ("_bucket", "_sum", "_count")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    path = DEPLOY / "grafana" / "dashboards" / "ttfa.json"
    assert path.is_file(), f"missing {path.relative_to(ROOT)}"
    return json.loads(path.read_text())


# --- Grafana ------------------------------------------------------------------------------------


def test_grafana_datasource_is_the_compose_prometheus():
    config = load_yaml("grafana/provisioning/datasources/prometheus.yml")
    (ds,) = [d for d in config["datasources"] if d["type"] == "prometheus"]
    assert ds["uid"] == "prometheus"
    assert ds["url"] == "http://prometheus:9090"
    assert ds["isDefault"] is True


def test_grafana_dashboard_provider_reads_the_mounted_folder():
    config = load_yaml("grafana/provisioning/dashboards/dashboards.yml")
    paths = [p["options"]["path"] for p in config["providers"]]
    assert "/var/lib/grafana/dashboards" in paths


def panels_of(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return out


def exprs_of(dashboard: dict) -> list[str]:
    return [t["expr"] for p in panels_of(dashboard) for t in p.get("targets", []) if t.get("expr")]


def test_dashboard_shape(dashboard):
    assert dashboard["title"] == "MOSS Speech: time to first audio"
    assert dashboard["refresh"] == "5s"
    graphs = [p for p in panels_of(dashboard) if p["type"] != "row"]
    # time series, and one table: the alerts firing (rules.yml's, through Prometheus's ALERTS series)
    assert graphs and all(p["type"] == "timeseries" for p in graphs if p["title"] != "Firing alerts")
    (alerts,) = [p for p in graphs if p["type"] == "table"]
    assert alerts["title"] == "Firing alerts" and alerts["gridPos"]["y"] <= 1  # on top, under the first row's title
    assert [t["expr"] for t in alerts["targets"]] == ['ALERTS{alertstate="firing"}']
    for panel in graphs:
        assert panel["datasource"]["uid"] == "prometheus", panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == "prometheus", panel["title"]
    ids = [p["id"] for p in panels_of(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_dashboard_covers_ttfa_and_every_stage(dashboard):
    exprs = "\n".join(exprs_of(dashboard))
    for q in ("0.5", "0.95", "0.99"):  # the quantiles of deploy/prometheus/rules.yml
        assert f"histogram_quantile({q}, sum by (le) (rate(gateway_ttfa_seconds_bucket[1m])))" in exprs
    for metric in (
        "llm_queue_wait_seconds",
        "llm_prefill_seconds",
        "llm_time_to_first_audio_token_seconds",
        "llm_inter_token_seconds",
        "vocoder_chunk_seconds",
        "vocoder_first_chunk_seconds",
        "gateway_llm_first_chunk_seconds",
        "gateway_vocoder_first_pcm_seconds",
        "gateway_real_time_factor",
    ):
        assert f"{metric}_bucket" in exprs, f"no panel for {metric}"
    for metric in (
        "gateway_requests_total",
        "llm_kv_blocks_used",
        "llm_kv_blocks_free",
        "llm_requests_running",
        "llm_requests_waiting",
        "vocoder_active_streams",
    ):
        assert re.search(rf"\b{metric}\b", exprs), f"no panel for {metric}"


def declared_metrics(service: str) -> set[str]:
    path = ROOT / "services" / service / "metrics.py"
    if not path.is_file():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: it should declare the {service} service's metrics")
    return set(QUOTED_METRIC.findall(path.read_text()))


def is_declared(name: str, declared: set[str]) -> bool:
    """A series name is declared if its metric is: histogram series carry _bucket/_sum/_count, and a
    counter is exposed with _total whether or not its declaration spells it."""
    candidates = {name}
    for suffix in SERIES_SUFFIXES:
        if name.endswith(suffix):
            candidates.add(name[: -len(suffix)])
    candidates |= {c[: -len("_total")] for c in candidates if c.endswith("_total")}
    return bool(candidates & declared)


def test_dashboard_metrics_are_declared_by_the_services(dashboard):
    declared = {service: declared_metrics(service) for service in MOSS_SERVICES}
    used = {m for expr in exprs_of(dashboard) for m in METRIC_IN_EXPR.findall(expr)}
    assert used, "the dashboard queries no gateway_/llm_/vocoder_ metrics"
    undeclared = sorted(m for m in used if not is_declared(m, declared[m.split("_", 1)[0]]))
    assert not undeclared, f"dashboard uses metrics no services/*/metrics.py declares: {undeclared}"


# What the dashboard is for, and the series one panel must query for each. Stalls are not among them: they are
# measured at the client (moss-serve bench), and no service exports a stall metric.
PANEL_SUBJECTS = {
    "TTFA p50/p95/p99": {"gateway_ttfa_seconds_bucket"},
    "real-time factor": {"gateway_real_time_factor_bucket"},
    "active streams": {"gateway_active_requests", "vocoder_active_streams"},
    "KV usage": {"llm_kv_blocks_used", "llm_kv_blocks_free"},
    "batch sizes": {"llm_batch_size_bucket", "vocoder_batch_size_bucket"},
    "errors by gRPC code": {"gateway_requests_total", "llm_requests_total", "vocoder_requests_total"},
    "pacing": {"llm_paced_seconds_total"},
    "end of speech to first audio": {"gateway_speech_end_to_first_audio_seconds_bucket"},
    "speakers in the encoder": {"encoder_speakers", "encoder_speaker_places"},
    "NaN or inf in the audio": {"vocoder_nonfinite_windows_total"},
}
SECONDS_HISTOGRAM = re.compile(r"""Histogram\(\s*["']((?:gateway|llm|vocoder|encoder)_\w+_seconds)["']""")


def metrics_of(panel: dict) -> set[str]:
    return {m for t in panel.get("targets", []) for m in METRIC_IN_EXPR.findall(t.get("expr", ""))}


@pytest.mark.parametrize("subject", PANEL_SUBJECTS)
def test_dashboard_has_a_panel_for(dashboard, subject):
    wanted = PANEL_SUBJECTS[subject]
    assert any(wanted <= metrics_of(p) for p in panels_of(dashboard)), f"no panel queries all of {sorted(wanted)}"


def test_dashboard_errors_are_by_grpc_code_without_ok(dashboard):
    # the request-rate panel shows every code; errors need their own scale, or OK's rate flattens them
    for service in MOSS_SERVICES:
        error_rate = re.compile(rf'\bby \(code\) .*\b{service}_requests_total\{{code!="OK"\}}')
        assert any(error_rate.search(e) for e in exprs_of(dashboard)), f"no errors-by-code query for {service}"


def test_dashboard_charts_every_stage_histogram(dashboard):
    """The per-stage breakdown is whatever latency histograms the services declare: a new stage needs a panel."""
    sources = [(ROOT / "services" / s / "metrics.py").read_text() for s in MOSS_SERVICES]
    declared = {m for text in sources for m in SECONDS_HISTOGRAM.findall(text)}
    assert len(declared) >= 10, f"found too few latency histograms to trust the pattern: {sorted(declared)}"
    charted = {m for p in panels_of(dashboard) for m in metrics_of(p)}
    missing = sorted(m for m in declared if f"{m}_bucket" not in charted)
    assert not missing, f"latency histograms with no dashboard panel: {missing}"


def test_dashboard_ttfa_quantiles_are_the_recording_rules(dashboard):
    """The TTFA panel and the series rules.yml records mean the same p50/p95/p99."""
    rules = load_yaml("prometheus/rules.yml")
    recorded = {m.group(1): r["expr"] for g in rules["groups"] for r in g["rules"]
                if (m := re.fullmatch(r"gateway:ttfa_seconds:(p\d+)_1m", r.get("record", "")))}
    (panel,) = [p for p in panels_of(dashboard) if "sum by (le) (rate(gateway_ttfa_seconds_bucket" in str(p.get("targets"))]
    assert {t["legendFormat"]: t["expr"] for t in panel["targets"]} == recorded


def test_alert_rules_query_declared_metrics():
    """Every gateway_/llm_/vocoder_/encoder_ series an alert of prometheus/rules.yml reads is one a service declares:
    an alert on a renamed metric would never fire."""
    declared = {service: declared_metrics(service) for service in MOSS_SERVICES}
    rules = load_yaml("prometheus/rules.yml")
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    used = {m for expr in exprs for m in METRIC_IN_EXPR.findall(expr)}
    assert "vocoder_nonfinite_windows_total" in used and "gateway_audio_turns_total" in used, used
    undeclared = sorted(m for m in used if not is_declared(m, declared[m.split("_", 1)[0]]))
    assert not undeclared, f"alerts read metrics no services/*/metrics.py declares: {undeclared}"
