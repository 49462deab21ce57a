"""The monitoring path end to end, with a real Prometheus server (Debian's package; `make tools` installs it).

test_deploy.py parses deploy/ and promtool checks its syntax; neither shows that the queries Grafana and the
recording rules run give back the TTFA the gateway measured. Here Prometheus runs the repository's own
prometheus.yml and rules.yml against the three services, a few turns go through the gateway, and the TTFA
quantiles are read back through Prometheus's HTTP API with exactly the PromQL of the dashboard's TTFA panel and
the rules' recorded series, then held to the ttfa_seconds each client was told in its SynthesisSummary.

Only two things differ from the shipped configuration: the targets are the test's loopback ports, and scrapes and
rule evaluations run every second (not every 5 or 15 s), so that rate(...[1m]) has two samples a second or two
after the turns and the test takes seconds.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import grpc
import pytest
import yaml
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from test_dashboard import METRIC_IN_EXPR, exprs_of, panels_of
from test_deploy_tools import tool

from services.common.metrics import LATENCY_BUCKETS
from services.stack import free_port

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "ttfa.json"
JOBS = ("gateway", "llm", "vocoder", "encoder")
QUANTILES = ("p50", "p95", "p99")
TURNS = 3
TIMEOUT = 30.0  # seconds for Prometheus to start, to see its targets up, and to see the turns
# Queries are evaluated this far in the past: the three recording rules of one group evaluation are written one
# after the other, so "now" could see p50 of the newest evaluation beside p99 of the one before.
LAG = 2.0


# --- Prometheus, as a process and through its HTTP API -------------------------------------------


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n--- prometheus log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def api(self, path: str, **params) -> dict:
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{urlencode(params)}", timeout=5) as r:
                body = json.load(r)
        except urllib.error.HTTPError as err:
            body = json.load(err)  # a refused query is explained in the body (status "error")
        error = f"{path} {params}: {body.get('errorType')}: {body.get('error')}"
        assert body["status"] == "success", error + self.log_tail()
        return body["data"]

    def vector(self, expr: str, at: float) -> list[dict]:
        data = self.api("/api/v1/query", query=expr, time=f"{at:.3f}")
        assert data["resultType"] == "vector", f"{expr}: {data}"
        return data["result"]

    def value(self, expr: str, at: float) -> float | None:
        """The one sample of an instant query (NaN stays NaN), or None when the result is empty."""
        result = self.vector(expr, at)
        assert len(result) <= 1, f"{expr} gave {len(result)} series, expected one: {result}"
        return float(result[0]["value"][1]) if result else None

    def by_label(self, expr: str, label: str, at: float) -> dict[str, float]:
        return {s["metric"][label]: float(s["value"][1]) for s in self.vector(expr, at)}

    def wait(self, what: str, check, timeout: float = TIMEOUT):
        """Poll check() until it returns (done, state) with done true; fail with the last state and the log."""
        deadline = time.monotonic() + timeout
        while True:
            done, state = check()
            if done:
                return state
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited with {self.proc.returncode} waiting for {what}{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not after {timeout:.0f} s; last state {state}{self.log_tail()}")
            time.sleep(0.25)

    def ready(self) -> tuple[bool, str]:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200, f"HTTP {r.status}"
        except (urllib.error.URLError, ConnectionError) as err:  # not listening yet, or 503 while starting
            return False, repr(err)

    def targets_up(self) -> tuple[bool, dict]:
        targets = self.api("/api/v1/targets", state="active")["activeTargets"]
        health = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in targets}
        return all(health.get(job, ("",))[0] == "up" for job in JOBS), health


def write_config(directory: Path, metrics_ports: dict[str, int]) -> Path:
    """deploy/prometheus's config and rules, pointed at the test's ports and sped up to 1 s."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(JOBS), f"prometheus.yml scrapes {sorted(jobs)}"
    for name, job in jobs.items():
        job.update(scrape_interval="1s", scrape_timeout="1s")  # in case a job sets its own
        job["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_ports[name]}"]}]
    for rule_file in config.get("rule_files", []):  # relative to the config file, so copied beside it
        rules = yaml.safe_load((PROMETHEUS_DIR / rule_file).read_text())
        for group in rules["groups"]:
            group["interval"] = "1s"
        (directory / rule_file).write_text(yaml.safe_dump(rules, sort_keys=False))
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def prometheus(request, tmp_path_factory):
    """Prometheus on a free port, scraping the stack, with all three targets up.

    The stack is asked for inside (not as an argument, which pytest would set up first, being session-scoped) so
    that without prometheus the tests skip without starting it."""
    binary = tool("prometheus")
    stack = request.getfixturevalue("stack")
    directory = tmp_path_factory.mktemp("prometheus")
    config = write_config(directory, stack.ports.metrics)
    port = free_port()
    log = directory / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        server.wait("prometheus ready", server.ready)
        server.wait("all three targets up", server.targets_up)  # ~5 s: Prometheus applies new targets every 5 s
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the turns, and what Prometheus saw of them --------------------------------------------------


def ttfa_panel_queries() -> dict[str, str]:
    """legend (p50/p95/p99) → PromQL of the dashboard's TTFA panel, as Grafana sends it."""
    dashboard = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in panels_of(dashboard)
                if any("sum by (le) (rate(gateway_ttfa_seconds_bucket" in t.get("expr", "") for t in p.get("targets", []))]
    return {t["legendFormat"]: t["expr"] for t in panel["targets"]}


def ttfa_rules() -> dict[str, str]:
    """p50/p95/p99 → the recorded series of rules.yml (gateway:ttfa_seconds:p50_1m, ...)."""
    rules = yaml.safe_load((PROMETHEUS_DIR / "rules.yml").read_text())
    records = [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
    return {m.group(1): name for name in records if (m := re.fullmatch(r"gateway:ttfa_seconds:(p\d+)_1m", name))}


async def synthesize(target: str, seed: int) -> gateway_pb2.SynthesisSummary:
    request = gateway_pb2.SynthesizeRequest(
        text="Hello there", sampling=common_pb2.SamplingParams(max_new_tokens=6, seed=seed))  # short: quick on CPU
    async with grpc.aio.insecure_channel(target) as channel:
        messages = [m async for m in gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=60)]
    assert messages[-1].WhichOneof("kind") == "summary", messages[-1]
    return messages[-1].summary


@dataclass
class Seen:
    at: float                   # when every query below was evaluated
    ttfas: list[float]          # SynthesisSummary.ttfa_seconds of each turn
    codes_before: dict[str, float]
    codes_after: dict[str, float]
    buckets_before: dict[str, float]  # le → gateway_ttfa_seconds_bucket before the turns
    panel: dict[str, float]     # p50/p95/p99 through the dashboard's PromQL
    rules: dict[str, float]     # p50/p95/p99 of the recording rules


@pytest.fixture(scope="module")
def seen(prometheus, request) -> Seen:
    """TURNS turns through the gateway, then Prometheus's view of them once it has scraped all of them."""
    stack = request.getfixturevalue("stack")  # not an argument: see prometheus()
    panel_queries, rules = ttfa_panel_queries(), ttfa_rules()
    assert set(panel_queries) == set(QUANTILES), f"dashboard TTFA panel legends: {sorted(panel_queries)}"
    assert set(rules) == set(QUANTILES), f"rules.yml TTFA records: {sorted(rules.values())}"
    # The targets are up, so each has been scraped once: this is the state before the turns.
    now = time.time()
    codes_before = prometheus.by_label("sum by (code) (gateway_requests_total)", "code", now)
    buckets_before = prometheus.by_label("sum by (le) (gateway_ttfa_seconds_bucket)", "le", now)

    ttfas = [asyncio.run(synthesize(stack.target("gateway"), seed)).ttfa_seconds for seed in range(TURNS)]

    def look():
        at = time.time() - LAG
        state = Seen(at, ttfas, codes_before, prometheus.by_label("sum by (code) (gateway_requests_total)", "code", at),
                     buckets_before, {q: prometheus.value(e, at) for q, e in panel_queries.items()},
                     {q: prometheus.value(r, at) for q, r in rules.items()})
        turns_seen = sum(state.codes_after.values()) - sum(codes_before.values())
        # the counter goes up as each call ends, after its TTFA was observed: when it shows every turn, so does TTFA
        finite = all(v is not None and math.isfinite(v) for v in (*state.panel.values(), *state.rules.values()))
        return turns_seen >= TURNS and finite, state

    return prometheus.wait(f"Prometheus to see {TURNS} turns and finite TTFA quantiles", look)


def bucket_range(ttfas: list[float], buckets_before: dict[str, float]) -> tuple[float, float]:
    """Where histogram_quantile over these turns' rate() must land, given LATENCY_BUCKETS.

    Low end: the lower bound of the fastest turn's bucket (the buckets below gained nothing, so hold no rank).
    High end: the first bound that every TTFA the gateway ever recorded lies under, earlier tests' included. Not
    just ours: rate() extrapolates a counter that started at 0 less far back than one that did not, so a bucket
    that earlier, slower turns left at 0 can read a little under +Inf and push p99 into the next bucket; a bucket
    that has always equalled +Inf reads exactly as +Inf does. Beyond the last bound, histogram_quantile answers
    the last bound.
    """
    low = max((b for b in LATENCY_BUCKETS if b < min(ttfas)), default=0.0)
    total = buckets_before.get("+Inf", 0.0)
    earlier = min((float(le) for le, n in buckets_before.items() if n == total), default=0.0)  # their bound
    high = min((b for b in LATENCY_BUCKETS if b >= max(*ttfas, earlier)), default=LATENCY_BUCKETS[-1])
    return low, high


# --- the tests -----------------------------------------------------------------------------------


def test_prometheus_counts_every_turn(seen):
    gained = {code: n - seen.codes_before.get(code, 0.0) for code, n in seen.codes_after.items()}
    assert {code: n for code, n in gained.items() if n} == {"OK": TURNS}, (seen.codes_before, seen.codes_after)


@pytest.mark.parametrize("source", ["panel", "rules"])
def test_ttfa_quantiles_read_back_what_the_gateway_reported(seen, source):
    quantiles = getattr(seen, source)
    low, high = bucket_range(seen.ttfas, seen.buckets_before)
    context = f"{source} {quantiles}, client TTFAs {seen.ttfas}, buckets before {seen.buckets_before}"
    assert all(v > 0 for v in quantiles.values()), context
    assert quantiles["p50"] <= quantiles["p95"] <= quantiles["p99"], context
    for q, v in quantiles.items():
        assert low <= v <= high, f"{q} = {v} outside [{low}, {high}]: {context}"


def test_every_dashboard_query_runs_on_live_series(prometheus, seen):
    """Every panel's PromQL is accepted, and every series it names has been scraped (an _bucket, a _total or a
    gauge the services really expose, not only one their metrics.py declares)."""
    dashboard = json.loads(DASHBOARD.read_text())
    names = set()
    for expr in exprs_of(dashboard):
        prometheus.vector(expr, seen.at)  # fails on a query Prometheus refuses
        names.update(METRIC_IN_EXPR.findall(expr))
    def missing() -> tuple[bool, list[str]]:
        absent = sorted(n for n in names if not prometheus.vector(f"group({n})", time.time()))
        return not absent, absent

    # A series born during the turns (a counter's first label value) is in Prometheus once its service has been scraped
    # after it; each service is scraped at a moment of its own, so this waits for it rather than reads one instant.
    prometheus.wait("every series the dashboard queries, scraped (the last state: those never scraped)", missing)
