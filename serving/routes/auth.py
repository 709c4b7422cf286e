"""Optional bearer-token authentication of the REST API: a static token file, Kubernetes TokenReview, or both."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from pathlib import Path
from typing import Protocol

import httpx
from fastapi import HTTPException, Request

from recommender.settings import AuthSettings

log = logging.getLogger(__name__)


class Authenticator(Protocol):
    def accepts(self, token: str) -> bool: ...


class TokenFile:
    """The expected bearer token, cached until the file's modification time or size changes (rotation)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = b""

    def token(self) -> bytes:
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._token = self.path.read_bytes().strip()
            self._stamp = stamp
        return self._token

    def accepts(self, token: str) -> bool:
        try:
            expected = self.token()
        except OSError:
            return False  # no readable token file: nobody gets in rather than everybody
        return bool(expected) and hmac.compare_digest(token.encode(), expected)


class TokenReviewer:
    """Asks the API server whether a token is valid (TokenReview); answers are reused for `cache_seconds`.

    Any failure to ask (network, TLS, a non-201 answer) denies the request and is not cached.
    """

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._cache: dict[str, tuple[bool, float]] = {}
        self._lock = threading.Lock()

    def accepts(self, token: str) -> bool:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        try:
            authenticated = self._review(token)
        except (OSError, httpx.HTTPError, ValueError) as error:
            log.warning("TokenReview failed, request denied: %s", error)
            return False
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
            self._cache[key] = (authenticated, now + self.settings.token_review_cache_seconds)
        return authenticated

    def _review(self, token: str) -> bool:
        credentials = self.settings.service_account_token_file.read_text().strip()
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        response = httpx.post(
            self.settings.api_server_url.rstrip("/") + "/apis/authentication.k8s.io/v1/tokenreviews",
            json=review, headers={"Authorization": f"Bearer {credentials}"},
            verify=str(self.settings.api_server_ca_file), timeout=5,
        )
        response.raise_for_status()
        return bool((response.json().get("status") or {}).get("authenticated"))


def authenticators(settings: AuthSettings) -> list[Authenticator]:
    """What the settings enable; an empty list leaves the REST API open."""
    found: list[Authenticator] = []
    if settings.token_file is not None:
        found.append(TokenFile(settings.token_file))
    if settings.token_review:
        found.append(TokenReviewer(settings))
    return found


def require_token(request: Request) -> None:
    """Dependency of /api/v1: a 401 unless auth is off or some authenticator accepts the bearer token."""
    enabled: list[Authenticator] = request.app.state.authenticators
    if not enabled:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip() or not any(a.accepts(token.strip()) for a in enabled):
        raise HTTPException(status_code=401, detail="bearer token required", headers={"WWW-Authenticate": "Bearer"})
