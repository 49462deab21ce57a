"""Shared fixtures: tiny models built here (random weights, real key names), and the three services
as real processes on free loopback ports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

# Without a GPU, the Triton kernels' tests run in Triton's CPU interpreter (set before triton is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from services.stack import Ports, Stack, free_port, is_serving

# One CPU thread for torch, here and in every service process the tests start: the suite's work is small tensors in
# several processes at once on a few cores, where a second thread per process nearly doubled the CPU time for ~10%
# more speed alone (tests/test_codec_stream.py, test_vocoder_stream.py, test_vocoder_activation.py: 133 → 73 CPU
# seconds, 86 → 78 s). Set before any service is started; a caller's own OMP_NUM_THREADS wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# A case for Triton's CPU interpreter alone: CPU tensors through a kernel with an interpreter's tile (few programs,
# since it runs them one by one), whose float32 shared memory would pass an SM's. On a GPU the interpreter is off and
# the GPU's own cases run the kernel.
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter's case (CPU tensors, a "
                                      "tile past an SM's shared memory): on a GPU its own cases run the kernel")


def _interpreter_loop_bounds() -> None:
    """CPU interpreter only (TRITON_INTERPRET=1): Triton 3.6's interpreter holds scalars as 1-element arrays
    and turns a loop bound into an int with int(array), which NumPy >= 2.4 refuses; these kernels loop up to
    loaded lengths (range(start, ctx, ...)), so take the element explicitly. No effect on compiled kernels."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "takes_element", False):
        return

    def patch_with_index(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_with_index.takes_element = True
    interpreter._patch_lang_tensor = patch_with_index


if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        _interpreter_loop_bounds()
    except ImportError:  # no triton: the kernel tests skip themselves
        pass


# `make test` runs the suite in two parts. First these modules, two at a time (pytest-xdist, `-m parallel -n 2`): their
# tests compute (kernels in Triton's interpreter, the models' math), or start services only to check what they answer,
# with deadlines of seconds to spare. Then every other module, one test at a time on an otherwise idle machine
# (`-m "not parallel"`): those race clocks of their own (stall clocks, refusal latencies, stall-free playback, the
# headroom rule's TTFA), which a second test's work beside them would move (even idle-scheduled: 2026-12-01, the
# Makefile). A new module runs alone until added here. Measured on the 2-core development machine (2026-12-01): these
# 539 s, the rest 418 s (in a clean clone an hour later, on a slower spell of the machine, 835 s and 410 s); then
# test_voice_api, test_solve_worker and test_backends joined these (their deadlines are tens of seconds).
PARALLEL_MODULES = frozenset({
    "test_fuzz_gateway", "test_load_cleanup", "test_rolling_restart", "test_spare",
    "test_auth", "test_bench", "test_bigvgan_package", "test_block_manager", "test_chunk_attention",
    "test_codec_history", "test_codec_parity", "test_codec_peer", "test_codec_prefix", "test_codec_service",
    "test_vocoder_capture", "test_restart_report", "test_rolling_report", "test_voices_live", "test_voice_owners",
    "test_codec_solve", "test_codec_stream", "test_conformer", "test_encoder_state", "test_dashboard", "test_deploy",
    "test_deploy_tools", "test_e2e",
    "test_encoder_attention", "test_encoder_checkpoint", "test_encoder_graphs", "test_encoder_model",
    "test_encoder_reference", "test_encoder_service", "test_encoder_stream", "test_encoder_vad",
    "test_encoder_worker", "test_engine", "test_error_sizes", "test_flow_steps_agreement", "test_fp8",
    "test_fp8_agreement", "test_frame_ops", "test_fused_kernels", "test_fused_linear", "test_prefetch_linear", "test_generation_rules",
    "test_health", "test_hift_snake", "test_house", "test_http", "test_interceptor", "test_kernel_compile",
    "test_kernel_runner", "test_layering", "test_llm_reference", "test_llm_report", "test_llm_service",
    "test_matmul_check", "test_megakernel", "test_mel_filters", "test_memory", "test_model", "test_mps", "test_overlap",
    "test_overload_report", "test_paged_attention", "test_prometheus", "test_prompt_layout", "test_protos",
    "test_replicas", "test_sampler", "test_sessions", "test_settings", "test_speech_input", "test_spoken_turns",
    "test_text_skip", "test_time_stretch", "test_timeline", "test_tls", "test_trt_runner", "test_up", "test_vocoder",
    "test_vocoder_activation", "test_vocoder_finite", "test_vocoder_stream", "test_voice_maker", "test_voice_api",
    "test_solve_worker", "test_backends", "test_gpu_share", "test_vocoder_metrics",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in PARALLEL_MODULES:
            item.add_marker(pytest.mark.parallel)


@pytest.fixture(scope="module")
def flow():
    """The codec's flow in the tiny-codec layout, random weights (float32, CPU)."""
    from services.vocoder.codec.checkpoint import random_codec
    from services.vocoder.codec.config import tiny

    return random_codec(tiny(), 0)[0].eval()


@pytest.fixture(scope="module")
def voices():
    """Two voices for the tiny flow, of prompts of 10 and 17 tokens (prefixes of 20 and 40 frames)."""
    from services.vocoder.codec.config import tiny
    from services.vocoder.codec.voice import random_voice

    cfg = tiny().flow
    return [random_voice(cfg, "alto", prompt_tokens=10, seed=1), random_voice(cfg, "tenor", prompt_tokens=17, seed=2)]


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """llm + vocoder + encoder + gateway on the tiny presets, shared by the tests that only send requests: the path
    users are served by (the vocoder's default, the codec's flow + HiFT at their tiny size)."""
    with Stack(Ports.free(), log_dir=tmp_path_factory.mktemp("stack-logs")) as s:
        yield s


@pytest.fixture(scope="session")
def stand_in_stack(tmp_path_factory):
    """llm + vocoder + gateway with the vocoder's stand-in decoder (--preset tiny), for the tests that need what only
    it gives: it vocodes exactly the tokens a chunk brings, and keeps several streams in real time on a 2-core CPU,
    where the codec's flow + HiFT does not always (tests of the admission rule's promise to the streams it admits)."""
    with Stack(Ports.free(), without=("encoder",), extra_args={"vocoder": ["--preset", "tiny"]},
               log_dir=tmp_path_factory.mktemp("stand-in-logs")) as s:
        yield s


@contextlib.contextmanager
def own_gateway(stack: Stack, log_dir, *flags: str, env: dict[str, str] | None = None, http: bool = False,
                serving: bool = True):
    """A gateway process of its own, with `flags` (and `env` added to its environment), in front of `stack`'s llm and
    vocoder → (target, metrics port, proc, http port). A gateway starts in about a second (it imports no torch), a
    whole stack in several. http: its HTTP door on a free port (else off: aiohttp's imports are half its start).
    serving=False: a stage is down (its health never says SERVING); started once its HTTP door answers /healthz."""
    grpc_port, metrics_port = free_port(), free_port()
    http_port = int(flags[flags.index("--http-port") + 1]) if "--http-port" in flags else free_port() if http else 0
    target = f"127.0.0.1:{grpc_port}"
    with open(log_dir / "gateway.log", "w") as log:
        backends = [arg for s in ("llm", "vocoder") if f"--{s}-target" not in flags  # (flags may name replicas)
                    for arg in (f"--{s}-target", stack.target(s))]
        http = [] if "--http-port" in flags else ["--http-port", str(http_port)]
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "gateway", "--port", str(grpc_port),
                                 "--metrics-port", str(metrics_port), *http, *backends, *flags], stdout=log,
                                stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            deadline = time.monotonic() + 60
            while not (is_serving(target) if serving else door_open(http_port)):
                assert proc.poll() is None and time.monotonic() < deadline, f"the gateway did not start: {log.name}"
                time.sleep(0.1)
            yield SimpleNamespace(target=target, metrics=metrics_port, proc=proc, http=http_port)
        finally:
            proc.terminate()
            proc.wait(10)


def silent_speech_client(port: int, text: str, key: str | None = None) -> socket.socket:
    """A raw HTTP client with a tiny receive window that asks the HTTP door for a long reply (160 s of audio) and never
    reads it: it holds its place until --client-stall-seconds end it."""
    body = json.dumps({"model": "moss-speech", "voice": "alloy", "input": text, "response_format": "pcm",
                       "sampling": {"max_new_tokens": 2000, "min_new_tokens": 2000}}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"{auth}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def door_open(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def gateway_stack(stack: Stack, log_dir, *flags: str, env: dict[str, str] | None = None):
    """`stack` behind a gateway of its own with `flags`: .target(name) and .ports.metrics[name] as a Stack has them,
    the gateway's for "gateway". For tests of gateway options: the shared stack's llm and vocoder, not a stack each."""
    with own_gateway(stack, log_dir, *flags, env=env) as gateway:
        yield SimpleNamespace(target=lambda name: gateway.target if name == "gateway" else stack.target(name),
                              ports=SimpleNamespace(metrics={**stack.ports.metrics, "gateway": gateway.metrics}))


def left_held(gateway, stack: Stack) -> dict[str, float]:
    """What `gateway` and the stack's stages still hold for turns (all zero when idle): the encoder's places too where
    the stack runs one."""
    text, llm = scrape(gateway.metrics), scrape(stack.ports.metrics["llm"])
    held = {"gateway turns": metric_value(text, "gateway_active_requests"),
            "gateway sessions": metric_value(text, "gateway_active_sessions"),
            "llm running": metric_value(llm, "llm_requests_running"),
            "llm waiting": metric_value(llm, "llm_requests_waiting"),
            "llm KV blocks": metric_value(llm, "llm_kv_blocks_used"),
            "vocoder streams": metric_value(scrape(stack.ports.metrics["vocoder"]), "vocoder_active_streams")}
    if "encoder" in stack.names:
        held["encoder places"] = metric_value(scrape(stack.ports.metrics["encoder"]), "encoder_speakers")
    return held


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric_value(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    pattern = rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$" if labels else rf"^{re.escape(name)} ([0-9.e+-]+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def replica_ready(stack, name: str) -> bool:
    """Whether the stack's gateway has seen replica `name` (an llm's or a vocoder's instance) ready: its gauge."""
    backend = "llm" if name.startswith("llm") else "vocoder"
    return metric_value(scrape(stack.ports.metrics["gateway"]), "gateway_replica_ready",
                        f'{{backend="{backend}",target="{stack.target(name)}"}}') == 1


class UpProcess:
    """`moss-serve up` as a child process, its stderr read as it comes: a pipe nobody reads fills and stalls every service
    that writes to it, and a test that waits in vain should say what up said."""

    def __init__(self, flags: list[str]):
        self.proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up", *flags], stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")), daemon=True)
        self.reader.start()

    def wait_until(self, ready: Callable[[], bool], seconds: float = 120, what: str = "came up") -> None:
        """Until ready() (asked every 0.3 s); fails, with the end of up's stderr, if up exits or `seconds` pass first."""
        deadline = time.monotonic() + seconds
        while not ready():
            if (code := self.proc.poll()) is not None:
                raise AssertionError(f"moss-serve up exited with {code} before it {what}:\n{self.said(tail=40)}")
            assert time.monotonic() < deadline, f"moss-serve up never {what} in {seconds:.0f} s:\n{self.said(tail=40)}"
            time.sleep(0.3)

    def said(self, tail: int | None = None) -> str:
        """What up wrote to stderr so far (all of it once it has exited), or its last `tail` lines."""
        if self.proc.poll() is not None:
            self.reader.join(timeout=10)
        return "".join(self.lines[-tail:] if tail else self.lines)

    def stop(self, timeout: float = 30) -> int:
        """Ctrl-C → up's exit code."""
        self.proc.send_signal(2)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

