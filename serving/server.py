"""Running the app with uvicorn: the TLS certificate reloaded from disk when it changes, slow or oversized requests
cut off (serving.isolation), and client certificates asked for when mutual TLS is configured."""

from __future__ import annotations

import errno
import socket
import ssl
import sys

import uvicorn

from recommender.errors import ListenError
from serving.app import create_app
from serving.isolation import guarded_protocol
from serving.logs import LOG_CONFIG
from serving.settings import ServingSettings
from serving.tls import CertificateReloader


def run(settings: ServingSettings) -> None:
    """Serve until interrupted; HTTPS when a certificate and key are configured; logs as JSON lines."""
    serve = settings.serve
    tls = None
    if serve.tls_cert_file is not None and serve.tls_key_file is not None:
        tls = CertificateReloader(serve.tls_cert_file, serve.tls_key_file)
    # A worker thread deciding a big review holds the interpreter lock; a short interval hands it back to the
    # event loop (probes, small reviews) sooner.
    sys.setswitchinterval(serve.switch_interval_seconds)
    uvicorn.run(
        create_app(settings, tls),
        host=serve.host,
        port=serve.port,
        http=guarded_protocol(serve),
        timeout_keep_alive=serve.keep_alive_timeout_seconds,
        ssl_certfile=serve.tls_cert_file,
        ssl_keyfile=serve.tls_key_file,
        # Optional, not required: probes, Prometheus and the dashboard connect without one; the webhook and
        # extender routes refuse a call without it (serving.routes.auth.require_client_certificate).
        ssl_ca_certs=str(serve.client_ca_file) if serve.client_ca_file else None,
        ssl_cert_reqs=ssl.CERT_OPTIONAL if serve.client_ca_file else ssl.CERT_NONE,
        ssl_context_factory=tls.context_factory if tls else None,
        log_config=LOG_CONFIG,
    )


_CHOOSE = "choose another port with --port (or KOORD_RECOMMENDER_SERVE__PORT)"


def ensure_can_listen(host: str, port: int) -> None:
    """Bind each address uvicorn will (as asyncio does: every address `host` resolves to, SO_REUSEADDR) and let go:
    a taken port is one line naming it and --port, not uvicorn's JSON log line and the model store's exit code."""
    where = f"{'[' + host + ']' if ':' in host else host or '*'}:{port}"
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ListenError(f"cannot listen on {where}: {error.strerror} (KOORD_RECOMMENDER_SERVE__HOST)") from None
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise ListenError(f"port {port} on {host or '*'} is already in use: {_CHOOSE}") from None
                raise ListenError(f"cannot listen on {where}: {error.strerror}: {_CHOOSE}") from None
