"""Running the app with uvicorn, with the TLS certificate reloaded from disk when it changes."""

from __future__ import annotations

import uvicorn

from recommender.settings import Settings
from serving.app import create_app
from serving.logs import LOG_CONFIG
from serving.tls import CertificateReloader


def run(settings: Settings) -> None:
    """Serve until interrupted; HTTPS when a certificate and key are configured; logs as JSON lines."""
    serve = settings.serve
    tls = None
    if serve.tls_cert_file is not None and serve.tls_key_file is not None:
        tls = CertificateReloader(serve.tls_cert_file, serve.tls_key_file)
    uvicorn.run(
        create_app(settings, tls),
        host=serve.host,
        port=serve.port,
        ssl_certfile=serve.tls_cert_file,
        ssl_keyfile=serve.tls_key_file,
        ssl_context_factory=tls.context_factory if tls else None,
        log_config=LOG_CONFIG,
    )
