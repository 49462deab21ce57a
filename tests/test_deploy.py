"""Static checks of deploy/: compose and its overlays, the Dockerfile, Prometheus (the Grafana dashboard:
test_dashboard.py).

Docker is not available where the tests run, so these checks stand in for `docker compose config`:
they parse the files and hold them to the services' ports, flags and declared metric names.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from services.settings import GRPC_PORTS, METRICS_PORTS

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"

# service -> (gRPC port, metrics port): the services' declared defaults (services/settings.py)
PORTS = {name: (GRPC_PORTS[name], METRICS_PORTS[name]) for name in ("gateway", "llm", "vocoder", "encoder")}
MOSS_SERVICES = tuple(PORTS)
ALL_SERVICES = {*MOSS_SERVICES, "prometheus", "grafana"}



class ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: its merge tags (!override, !reset) say how to merge, not what the value is."""


for _tag in ("!override", "!reset"):
    ComposeLoader.add_constructor(_tag, lambda loader, node: (
        loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node, deep=True) if isinstance(node, yaml.MappingNode)
        else loader.construct_scalar(node)))


def load_yaml(rel: str):
    path = DEPLOY / rel
    assert path.is_file(), f"missing {path.relative_to(ROOT)}"
    return yaml.load(path.read_text(), Loader=ComposeLoader)


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_yaml("docker-compose.yml")


def command_args(service: dict) -> list[str]:
    """The service's command as argv; `--flag=value` is split into two items."""
    cmd = service.get("command")
    assert cmd, "service has no command"
    argv = shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            out.extend(arg.split("=", 1))
        else:
            out.append(arg)
    return out


def flag(argv: list[str], name: str) -> str | None:
    if name not in argv:
        return None
    i = argv.index(name)
    assert i + 1 < len(argv), f"{name} has no value"
    return argv[i + 1]


def host_port(mapping) -> tuple[int | None, int]:
    """(published, target) of one compose `ports` entry, short or long syntax."""
    if isinstance(mapping, dict):
        published = mapping.get("published")
        return (int(published) if published is not None else None, int(mapping["target"]))
    parts = str(mapping).split("/")[0].split(":")
    target = int(parts[-1])
    published = int(parts[-2]) if len(parts) >= 2 else None
    return published, target


def volume_targets(service: dict) -> dict[str, tuple[str, bool]]:
    """target -> (source, read_only) for the service's volumes, short or long syntax."""
    out = {}
    for vol in service.get("volumes", []):
        if isinstance(vol, dict):
            out[vol["target"]] = (str(vol.get("source", "")), bool(vol.get("read_only", False)))
            continue
        # short syntax SOURCE:TARGET[:MODE]; SOURCE may hold ${VAR:-default}, which has no ':' after '}'
        m = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(\w+(?:,\w+)*))?", str(vol))
        assert m, f"cannot parse volume {vol!r}"
        source, target, mode = m.groups()
        out[target] = (source, "ro" in (mode or "").split(","))
    return out


# --- docker-compose.yml -------------------------------------------------------------------------


def test_compose_has_the_five_services(compose):
    assert set(compose["services"]) >= ALL_SERVICES


@pytest.mark.parametrize("name", MOSS_SERVICES)
def test_moss_services_build_the_one_image(compose, name):
    svc = compose["services"][name]
    build = svc["build"]
    assert build["context"] == ".."
    assert build["dockerfile"] == "deploy/Dockerfile"
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()
    images = {compose["services"][n].get("image") for n in MOSS_SERVICES}
    assert len(images) == 1, f"llm, vocoder, encoder and gateway should share one image, got {images}"


@pytest.mark.parametrize("name", MOSS_SERVICES)
def test_moss_service_commands_use_the_right_ports(compose, name):
    argv = command_args(compose["services"][name])
    grpc_port, metrics_port = PORTS[name]
    assert argv[0] == name, f"command should start with the subcommand {name!r}: {argv}"
    assert flag(argv, "--host") == "0.0.0.0"
    assert flag(argv, "--port") == str(grpc_port)
    assert flag(argv, "--metrics-port") == str(metrics_port)


def test_gateway_targets_llm_and_vocoder(compose):
    argv = command_args(compose["services"]["gateway"])
    assert flag(argv, "--llm-target") == f"llm:{PORTS['llm'][0]}"
    assert flag(argv, "--vocoder-target") == f"vocoder:{PORTS['vocoder'][0]}"
    assert flag(argv, "--encoder-target") == f"encoder:{PORTS['encoder'][0]}"


@pytest.mark.parametrize(
    "name, flag_name, target, env",
    [
        ("llm", "--model-dir", "/models/moss-speech", "MOSS_MODEL_DIR"),
        ("vocoder", "--vocoder-dir", "/models/codec", "CODEC_DIR"),
        ("encoder", "--encoder-dir", "/models/speech-tokenizer", "SPEECH_TOKENIZER_DIR"),
    ],
)
def test_gpu_services_mount_their_weights_read_only(compose, name, flag_name, target, env):
    svc = compose["services"][name]
    argv = command_args(svc)
    assert flag(argv, "--device") == "cuda"
    assert flag(argv, flag_name) == target
    volumes = volume_targets(svc)
    assert target in volumes, f"{name} does not mount {target}"
    source, read_only = volumes[target]
    assert source.startswith("${" + env + ":-"), f"{name}: weights should come from ${env}: {source}"
    assert read_only, f"{name}: {target} should be mounted read-only"


@pytest.mark.parametrize("name", ["llm", "vocoder", "encoder"])
def test_llm_vocoder_and_encoder_reserve_an_nvidia_gpu(compose, name):
    devices = compose["services"][name]["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia"
        and (d.get("count") == 1 or len(d.get("device_ids", [])) == 1)
        and "gpu" in d.get("capabilities", [])
        for d in devices
    ), devices


def test_llm_and_vocoder_share_the_gpu_through_the_mps_service(compose):
    """One MPS daemon (the `mps` service, on the GPU) and its two clients: same pipe directory on the same volume,
    its IPC namespace, started once it is healthy; the llm's busy share the one `moss-serve up` gives it."""
    from services.cli import parser

    services = compose["services"]
    mps = services["mps"]
    assert mps["entrypoint"] == ["nvidia-cuda-mps-control", "-f"]
    assert mps["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    pipe = mps["environment"]["CUDA_MPS_PIPE_DIRECTORY"]
    assert any(v.split(":")[:2] == ["mps-pipe", pipe] for v in mps["volumes"])
    assert pipe in mps["healthcheck"]["test"][-1]
    for name in ("llm", "vocoder", "encoder"):
        svc = services[name]
        assert svc["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe, name
        assert any(v.split(":")[:2] == ["mps-pipe", pipe] for v in svc["volumes"]), name
        assert svc["ipc"] == "service:mps" and svc["depends_on"]["mps"]["condition"] == "service_healthy", name
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in services["vocoder"]["environment"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in services["encoder"]["environment"]
    # the llm as `moss-serve up` runs it: at MPS 100%, its busy steps on the share up gives it (gpu_share.py)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in services["llm"]["environment"]
    assert flag(command_args(services["llm"]), "--busy-share") == str(parser().parse_args(["up"]).mps_llm_threads)
    assert "mps-pipe" in compose["volumes"]


def test_only_the_gateway_grpc_and_http_ports_are_published(compose):
    services = compose["services"]
    published = [host_port(p) for p in services["gateway"].get("ports", [])]
    assert (50051, 50051) in published and (8000, 8000) in published
    assert "--http-port 8000" in services["gateway"]["command"]
    for name in ("llm", "vocoder", "encoder"):
        assert not services[name].get("ports"), f"{name} should stay on the compose network"


@pytest.mark.parametrize("name", MOSS_SERVICES)
def test_healthcheck_is_a_grpc_health_check_on_the_service_port(compose, name):
    test = compose["services"][name]["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] == "CMD", test
    assert test[1:3] == ["python", "-c"], test
    code = test[3]
    compile(code, f"<{name} healthcheck>", "exec")  # a valid one-liner
    assert "grpc_health.v1" in code and "HealthStub" in code
    assert f"localhost:{PORTS[name][0]}" in code


def test_gateway_waits_for_healthy_llm_vocoder_and_encoder(compose):
    depends = compose["services"]["gateway"]["depends_on"]
    for name in ("llm", "vocoder", "encoder"):
        assert depends[name]["condition"] == "service_healthy"


def test_prometheus_and_grafana_mounts(compose):
    prom = compose["services"]["prometheus"]
    assert str(prom["image"]).startswith("prom/prometheus")
    assert (9090, 9090) in [host_port(p) for p in prom["ports"]]
    prom_volumes = volume_targets(prom)
    source, _ = prom_volumes["/etc/prometheus/prometheus.yml"]
    assert (DEPLOY / source).resolve() == (DEPLOY / "prometheus" / "prometheus.yml").resolve()

    grafana = compose["services"]["grafana"]
    assert str(grafana["image"]).startswith("grafana/grafana")
    assert (3000, 3000) in [host_port(p) for p in grafana["ports"]]
    env = grafana["environment"]
    assert str(env["GF_AUTH_ANONYMOUS_ENABLED"]).lower() == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    mounts = volume_targets(grafana)
    provisioning, _ = mounts["/etc/grafana/provisioning"]
    assert (DEPLOY / provisioning).resolve() == (DEPLOY / "grafana" / "provisioning").resolve()
    dashboards, _ = mounts["/var/lib/grafana/dashboards"]
    assert (DEPLOY / dashboards / "ttfa.json").is_file()


# --- Dockerfile ---------------------------------------------------------------------------------


def test_dockerfile_installs_bigvgan_without_deps_then_the_project():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM\s+\$\{BASE_IMAGE\}", text, re.M)
    bigvgan = re.search(r"pip install --no-deps bigvgan==[\d.]+", text)
    project = re.search(r"pip install \.", text)
    assert bigvgan and project and bigvgan.start() < project.start()
    assert re.search(r'^ENTRYPOINT \["moss-serve"\]', text, re.M)


def test_the_image_installs_the_torch_build_the_gpu_code_is_tested_with():
    """torch 2.11.0 for CUDA 13.0 with its Triton (docs/benchmarks.md: the H100/H200 runs), Python 3.12 from
    Ubuntu 24.04, and a C compiler for Triton's launchers; torch before the project, so pip keeps that build."""
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^ARG TORCH_VERSION=2\.11\.0$", text, re.M)
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cu130$", text, re.M)
    assert re.search(r"^ARG BASE_IMAGE=ubuntu:24\.04$", text, re.M)  # its python3 is 3.12
    assert re.search(r"apt-get install [^\n]*\bgcc\b", text)
    torch = re.search(r'pip install [^\n]*"torch==\$\{TORCH_VERSION\}"', text)
    assert torch and torch.start() < re.search(r"pip install \.", text).start()
    benchmarks = (DEPLOY.parent / "docs" / "benchmarks.md").read_text()
    assert "torch 2.11.0+cu130" in benchmarks


# --- Prometheus ---------------------------------------------------------------------------------


def test_prometheus_scrapes_the_four_metrics_ports(compose):
    """The gateway by name; llm, vocoder and encoder by a network alias that every replica of theirs carries."""
    config = load_yaml("prometheus/prometheus.yml")
    default_interval = config.get("global", {}).get("scrape_interval", "1m")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for name, (_, metrics_port) in PORTS.items():
        assert name in jobs, f"no scrape job {name!r}"
        job = jobs[name]
        assert job.get("scrape_interval", default_interval) == "5s"
        if name == "gateway":
            assert [t for sc in job["static_configs"] for t in sc["targets"]] == [f"gateway:{metrics_port}"]
            continue
        (sd,) = job["dns_sd_configs"]
        assert sd["type"] == "A" and sd["port"] == metrics_port
        assert sd["names"] == compose["services"][name]["networks"]["default"]["aliases"] == [f"{name}-replicas"]


# --- overlays -----------------------------------------------------------------------------------


def test_the_tls_overlay_is_the_main_commands_plus_tls(compose):
    """docker-compose.tls.yml restates each command (compose replaces a command whole): it must be the main
    file's, plus the TLS flags, or the two would drift apart."""
    overlay = load_yaml("docker-compose.tls.yml")["services"]
    server = ["--tls-cert", "/tls/server.pem", "--tls-key", "/tls/server.key"]
    added = {"llm": server + ["--tls-client-ca", "/tls/ca.pem"], "vocoder": server + ["--tls-client-ca", "/tls/ca.pem"],
             "encoder": server + ["--tls-client-ca", "/tls/ca.pem"],
             "gateway": server + ["--backend-ca", "/tls/ca.pem", "--backend-cert", "/tls/gateway-client.pem",
                                  "--backend-key", "/tls/gateway-client.key"]}
    for name, flags in added.items():
        assert command_args(overlay[name]) == command_args(compose["services"][name]) + flags, name
        assert any(v.endswith(":/tls:ro") for v in overlay[name]["volumes"]), name
        probe = overlay[name]["healthcheck"]["test"][-1]
        assert "ssl_channel_credentials" in probe and f"{name}:{PORTS[name][0]}" in probe, name


def test_the_two_gpu_overlay_adds_a_replica_of_each_gpu_service_on_gpu_1(compose):
    overlay = load_yaml("docker-compose.two-gpus.yml")["services"]
    gpu = lambda svc: svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]  # noqa: E731
    for name in ("mps", "llm", "vocoder"):
        assert gpu(overlay[name]) == ["0"], name
        copy = overlay[f"{name}-2"]
        assert copy["extends"] == {"file": "docker-compose.yml", "service": name}
        assert gpu(copy) == ["1"], name
        assert copy["volumes"] == ["mps-pipe-2:/tmp/nvidia-mps"]  # GPU 1's own MPS daemon
        if name != "mps":
            assert copy["ipc"] == "service:mps-2" and list(copy["depends_on"]) == ["mps-2"]
    base = command_args(compose["services"]["gateway"])
    argv = command_args(overlay["gateway"])
    assert flag(argv, "--llm-target") == "llm:50052,llm-2:50052"
    assert flag(argv, "--vocoder-target") == "vocoder:50053,vocoder-2:50053"
    assert flag(argv, "--encoder-target") == "encoder:50054"  # one encoder serves both GPUs' sessions
    # (the turns running: as many as both vocoders' history slots, which the gateway learns from them)
    assert "--max-turns" not in argv and "--max-turns" not in base
    for name in ("--llm-target", "--vocoder-target"):  # otherwise the main file's command, as it is
        argv[argv.index(name) + 1] = base[base.index(name) + 1]
    assert argv == base


@pytest.mark.parametrize("name", ["gateway", "vocoder"])
def test_the_compose_services_take_the_flags_moss_serve_up_gives_on_a_gpu(compose, name):
    """What `up` adds on a GPU beyond the flags it forwards (admission by headroom, the start limit, the first-chunk
    lane) is what was measured: the compose stack runs the same."""
    from services.cli import parser
    from services.up import up_service_args

    def given(*argv):
        flags = up_service_args(parser().parse_args(["up", *argv]))[name]
        return dict(zip(flags[::2], flags[1::2]))
    on_gpu, elsewhere = given("--device", "cuda"), given()
    extra = {k: v for k, v in on_gpu.items() if elsewhere.get(k) != v and k not in ("--device", "--preset")}
    assert extra, "up gives this service nothing of its own on a GPU"
    argv = command_args(compose["services"][name])
    for key, value in extra.items():
        assert flag(argv, key) == value, key
