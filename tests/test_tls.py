"""TLS for clients and mutual TLS between the services, with certificates made here: a client reaches the
gateway only over TLS (gRPC and the HTTP door); llm and vocoder take only clients with a certificate of the stack's
CA (the gateway's), and health checks go over the same TLS."""

import asyncio
import datetime
import ipaddress
import ssl
import subprocess
import sys

import grpc
import httpx2 as httpx  # the HTTP client the openai package uses (tests/test_http.py)
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from moss.speech.v1 import common_pb2

from services.common.tls import ChannelTls
from services.gateway.client import synthesize
from services.stack import NO_SPEECH, Ports, Stack, is_serving

SAMPLING = common_pb2.SamplingParams(max_new_tokens=4, seed=1)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_leaf(ca, cn: str):
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)).add_extension(san, critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def write(directory, name: str, key, cert) -> tuple[str, str]:
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca("moss test CA")
    ca_pem, _ = write(d, "ca", *ca)
    other = make_ca("someone else's CA")
    files = {"ca": ca_pem, "other_ca": write(d, "other_ca", *other)[0]}
    for name in ("server", "gateway-client"):
        files[name] = write(d, name, *make_leaf(ca, name))
    files["stranger"] = write(d, "stranger", *make_leaf(other, "stranger"))
    return files


@pytest.fixture(scope="module")
def tls_stack(pki, tmp_path_factory):
    cert, key = pki["server"]
    client_cert, client_key = pki["gateway-client"]
    mutual = ["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", pki["ca"]]
    extra = {"llm": mutual, "vocoder": mutual,
             "gateway": ["--tls-cert", cert, "--tls-key", key,
                         "--backend-ca", pki["ca"], "--backend-cert", client_cert, "--backend-key", client_key]}
    as_gateway = ChannelTls(pki["ca"], client_cert, client_key)
    health = {"llm": as_gateway, "vocoder": as_gateway, "gateway": ChannelTls(pki["ca"])}
    with Stack(Ports.free(http=True), without=NO_SPEECH, log_dir=tmp_path_factory.mktemp("logs"), extra_args=extra,
               health_tls=health) as stack:
        yield stack


def test_a_client_speaks_through_tls_and_mutual_tls(tls_stack, pki):
    result = asyncio.run(synthesize(tls_stack.target("gateway"), "hi", sampling=SAMPLING, tls=ChannelTls(pki["ca"])))
    assert result.summary.audio_tokens == 4 and result.summary.num_samples > 0


def test_plaintext_and_untrusted_clients_are_turned_away(tls_stack, pki):
    gateway, llm = tls_stack.target("gateway"), tls_stack.target("llm")
    assert not is_serving(gateway)  # plaintext to a TLS port
    assert not is_serving(gateway, tls=ChannelTls(pki["other_ca"]))  # the server's certificate is not of that CA
    assert is_serving(gateway, tls=ChannelTls(pki["ca"]))
    assert not is_serving(llm, tls=ChannelTls(pki["ca"]))  # mutual TLS: no client certificate
    assert not is_serving(llm, tls=ChannelTls(pki["ca"], *pki["stranger"]))  # a certificate of another CA
    assert is_serving(llm, tls=ChannelTls(pki["ca"], *pki["gateway-client"]))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(synthesize(gateway, "hi", sampling=SAMPLING, timeout=5))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_http_door_serves_https_with_the_same_files(tls_stack, pki):
    """--http-port on a TLS gateway: HTTPS with the gateway's certificate; plain HTTP and another CA's trust fail."""
    url = f"https://127.0.0.1:{tls_stack.ports.http}"
    body = {"model": "moss-speech", "input": "hi", "voice": "alloy", "response_format": "pcm",
            "sampling": {"max_new_tokens": 4, "seed": 1}}
    reply = httpx.post(url + "/v1/audio/speech", json=body, verify=ssl.create_default_context(cafile=pki["ca"]),
                       timeout=60)
    assert reply.status_code == 200 and len(reply.content) > 0 and len(reply.content) % 2 == 0
    with pytest.raises(httpx.HTTPError):  # plaintext to the TLS port: no HTTP reply
        httpx.get(url.replace("https", "http") + "/healthz", timeout=5)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(url + "/healthz", verify=ssl.create_default_context(cafile=pki["other_ca"]), timeout=5)


def test_moss_serve_say_over_tls(tls_stack, pki, tmp_path):
    cmd = [sys.executable, "-m", "services.cli", "say", "hi", "--target", tls_stack.target("gateway"),
           "--max-new-tokens", "4", "-o", str(tmp_path / "a.wav"), "--tls-ca", pki["ca"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("flags, why", [
    (["--tls-cert", "x.pem"], "x.pem: no such file"),
    (["--tls-client-ca", "SELF"], "--tls-client-ca needs --tls-cert and --tls-key"),
])
def test_wrong_tls_flags_fail_at_start(pki, flags, why):
    flags = [pki["ca"] if f == "SELF" else f for f in flags]
    proc = subprocess.run([sys.executable, "-m", "services.cli", "vocoder", "--port", "0", "--metrics-port", "0", *flags],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr


def test_half_a_key_pair_fails_at_start(pki):
    cert, _ = pki["server"]
    proc = subprocess.run([sys.executable, "-m", "services.cli", "gateway", "--port", "0", "--metrics-port", "0",
                           "--tls-cert", cert], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--tls-cert and --tls-key go together" in proc.stderr, proc.stderr
