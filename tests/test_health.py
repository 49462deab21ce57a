"""Every server answers gRPC health checking and lists its service through reflection."""

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

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
