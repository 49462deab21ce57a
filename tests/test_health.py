"""Every server answers gRPC health checking and lists its service through reflection."""

import subprocess

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from services.stack import free_port

EXPECTED = {"gateway": "moss.speech.v1.Gateway", "llm": "moss.speech.v1.Llm", "vocoder": "moss.speech.v1.Vocoder"}


def test_health_and_reflection(stack):
    for service, full_name in EXPECTED.items():
        with grpc.insecure_channel(stack.target(service)) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", full_name):
                reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            services = set(ProtoReflectionDescriptorDatabase(channel).get_services())
            assert {full_name, "grpc.health.v1.Health"} <= services, services
            method = ProtoReflectionDescriptorDatabase(channel).FindFileContainingSymbol(full_name)
            assert method.package == "moss.speech.v1"


def test_a_port_in_use_is_an_error_at_start(stack):
    """A second gateway on a port the running one holds exits at once and says so: it must not share the port
    (gRPC's default SO_REUSEPORT would let it take half of the new connections)."""
    cmd = stack.command("gateway")
    cmd[cmd.index("--metrics-port") + 1], cmd[cmd.index("--http-port") + 1] = str(free_port()), str(free_port())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"cannot bind {stack.target('gateway')}" in proc.stderr, proc.stderr[-2000:]
    with grpc.insecure_channel(stack.target("gateway")) as channel:  # the running one is untouched
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_sigusr1_writes_every_threads_stack_and_the_service_goes_on(stack, tmp_path):
    """`kill -USR1` on a service that stopped answering shows what each of its threads waits for (its log), and does
    not stop it: a gateway of its own on the shared stack."""
    import signal
    import time

    cmd = stack.command("gateway")
    port = free_port()
    cmd[cmd.index("--port") + 1], cmd[cmd.index("--metrics-port") + 1] = str(port), str(free_port())
    cmd[cmd.index("--http-port") + 1] = str(free_port())
    log = tmp_path / "gateway.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            proc.send_signal(signal.SIGUSR1)
            for _ in range(50):
                if "Current thread" in log.read_text():
                    break
                time.sleep(0.1)
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        text = log.read_text()
        assert "Current thread" in text and 'File "' in text, text[-2000:]
        assert proc.poll() is None and reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.terminate()
        proc.wait(30)
