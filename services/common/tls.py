"""TLS for the services' gRPC ports and the gateway's channels to its backends, from PEM files.

A server with a certificate and key serves TLS; given a client CA as well, it requires every client to
present a certificate signed by it (mutual TLS: how llm and vocoder accept only the gateway). A channel
with a CA verifies the server's certificate against it; with a certificate and key as well, it presents
them (the gateway to llm and vocoder under mutual TLS). Health checks and reflection share the port, and
with it its TLS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


@dataclass(frozen=True)
class ServerTls:
    cert: str              # PEM certificate chain of this server
    key: str               # PEM private key
    client_ca: str | None = None  # PEM CA: clients must present a certificate it signed (mutual TLS)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(_read(self.key), _read(self.cert))], root_certificates=_read(self.client_ca),
                                           require_client_auth=self.client_ca is not None)

    def ssl_context(self):
        """The same files for an HTTP server (the gateway's HTTP door)."""
        import ssl

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca:
            context.load_verify_locations(self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


@dataclass(frozen=True)
class ChannelTls:
    ca: str                  # PEM CA the server's certificate must chain to
    cert: str | None = None  # PEM certificate and key to present (mutual TLS)
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=_read(self.ca), private_key=_read(self.key),
                                            certificate_chain=_read(self.cert))


def _exist(*paths: str | None) -> None:
    for path in paths:
        if path and not Path(path).is_file():
            raise ValueError(f"{path}: no such file")


def server_tls(cert: str | None, key: str | None, client_ca: str | None) -> ServerTls | None:
    """Flags → a ServerTls, or None for plaintext. Half a pair is an error, as is a client CA without TLS,
    or a file that is not there (found at start, before any model loads)."""
    _exist(cert, key, client_ca)
    if not cert and not key:
        if client_ca:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if not (cert and key):
        raise ValueError("--tls-cert and --tls-key go together")
    return ServerTls(cert, key, client_ca)


def channel_tls(ca: str | None, cert: str | None, key: str | None, flag: str = "--backend") -> ChannelTls | None:
    _exist(ca, cert, key)
    if not ca:
        if cert or key:
            raise ValueError(f"{flag}-cert and {flag}-key need {flag}-ca")
        return None
    if bool(cert) != bool(key):
        raise ValueError(f"{flag}-cert and {flag}-key go together")
    return ChannelTls(ca, cert, key)


def channel(target: str, tls: ChannelTls | None, options=()) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(target, options=list(options))
    return grpc.aio.secure_channel(target, tls.credentials(), options=list(options))


@dataclass(frozen=True)
class StackTls:
    """A stack's certificates in one directory, under the names deploy/docker-compose.tls.yml mounts: every
    service serves server.pem; llm and vocoder take only clients with a certificate of ca.pem, as the gateway's
    gateway-client.pem is."""

    directory: str

    FILES = ("ca.pem", "server.pem", "server.key", "gateway-client.pem", "gateway-client.key")

    def __post_init__(self):
        if missing := [name for name in self.FILES if not (Path(self.directory) / name).is_file()]:
            raise ValueError(f"{self.directory}: no {', '.join(missing)}")

    def path(self, name: str) -> str:
        return str(Path(self.directory) / name)

    def server_flags(self, mutual: bool) -> list[str]:
        """A service's --tls-* flags (mutual: clients must present a certificate of the CA)."""
        flags = ["--tls-cert", self.path("server.pem"), "--tls-key", self.path("server.key")]
        return flags + (["--tls-client-ca", self.path("ca.pem")] if mutual else [])

    def backend_flags(self) -> list[str]:
        """The gateway's flags for reaching llm and vocoder under mutual TLS."""
        return ["--backend-ca", self.path("ca.pem"), "--backend-cert", self.path("gateway-client.pem"),
                "--backend-key", self.path("gateway-client.key")]

    def client(self, mutual: bool) -> ChannelTls:
        """How to reach a service of the stack (mutual: with the gateway's certificate)."""
        if mutual:
            return ChannelTls(self.path("ca.pem"), self.path("gateway-client.pem"), self.path("gateway-client.key"))
        return ChannelTls(self.path("ca.pem"))
