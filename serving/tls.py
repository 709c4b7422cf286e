"""TLS certificate rotation without a restart.

uvicorn builds one `ssl.SSLContext` at start-up and never looks at the files again. Loading a new chain into that
same context makes every later handshake use it (OpenSSL copies the context's certificate into each new
connection), while connections already open keep theirs. The new pair is first loaded into a scratch context, so a
half-written file or a key that does not match the certificate leaves the serving pair untouched; the next poll
tries again.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class CertificateReloader:
    """Reloads the serving context's certificate chain when the certificate or key file changes on disk.

    Give `context_factory` to uvicorn (`ssl_context_factory`): it keeps the context uvicorn builds and serves with.
    """

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context: ssl.SSLContext | None = None
        self._seen = self._stamp()

    def context_factory(self, config: Any, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        self._seen = self._stamp()
        self.context = default()
        return self.context

    def _stamp(self) -> tuple[tuple[int, int], ...] | None:
        try:
            return tuple((s.st_mtime_ns, s.st_size) for s in (self.cert_file.stat(), self.key_file.stat()))
        except OSError:
            return None

    def check(self) -> bool:
        """Reload if the files changed and the new pair is valid; True when a new certificate is in use."""
        stamp = self._stamp()
        if self.context is None or stamp is None or stamp == self._seen:
            return False
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            log.warning("certificate not reloaded (will retry): %s", error)
            return False
        self._seen = stamp
        log.info("reloaded TLS certificate %s", self.cert_file)
        return True
