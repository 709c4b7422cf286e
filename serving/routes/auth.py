"""Who may call what: bearer tokens (a static token file, Kubernetes TokenReview, or both) for everything that
reveals a recommendation to a person or a scraper, and client certificates for the webhook and extender routes.

TokenReview runs on the event loop (an async client), never on the thread pool that sync routes use, so slow
reviews cannot make probes wait; its answers are cached (accepted and refused, each with its own TTL, bounded in
size), its calls are rate-limited and bounded in number in flight, and an accepted token can further be required
to carry an audience, belong to a group or pass a SubjectAccessReview.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import httpx
from fastapi import HTTPException, Request

from recommender.errors import ClientCertificateError, RateLimitedError
from serving.settings import AuthSettings, ServeSettings

log = logging.getLogger(__name__)


class Authenticator(Protocol):
    async def accepts(self, token: str) -> bool: ...


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

    async def accepts(self, token: str) -> bool:
        try:
            expected = self.token()
        except OSError:
            return False  # no readable token file: nobody gets in rather than everybody
        return bool(expected) and hmac.compare_digest(token.encode(), expected)


class TokenBucket:
    """`rate` calls a second on average, bursts of as many (at least one)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self._tokens = self.capacity
        self._at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class TokenReviewer:
    """Asks the API server whether a token is valid (TokenReview) and, where configured, allowed (audience, group,
    SubjectAccessReview). A failure to ask (network, TLS, timeout, a non-2xx answer) refuses and is not cached."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._cache: OrderedDict[str, tuple[bool, float]] = OrderedDict()
        self._bucket = TokenBucket(settings.token_review_rate_per_second)
        self._in_flight = asyncio.Semaphore(settings.token_review_concurrency)
        self._client: httpx.AsyncClient | None = None

    async def accepts(self, token: str) -> bool:
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cache.get(key)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        try:
            async with self._in_flight:
                accepted = await self._decide(token)
        except (OSError, httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("TokenReview failed, request refused: %s", error)
            return False
        ttl = self.settings.token_review_cache_seconds if accepted else self.settings.token_review_failure_cache_seconds
        self._cache[key] = (accepted, time.monotonic() + ttl)
        self._cache.move_to_end(key)
        while len(self._cache) > self.settings.token_review_cache_entries:
            self._cache.popitem(last=False)
        return accepted

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The `status` of a review the API server answered."""
        if not self._bucket.take():
            raise RateLimitedError("too many token reviews at once; retry in a second")
        if self._client is None:
            self._client = httpx.AsyncClient(
                verify=str(self.settings.api_server_ca_file), timeout=self.settings.token_review_timeout_seconds
            )
        credentials = self.settings.service_account_token_file.read_text().strip()
        response = await self._client.post(
            self.settings.api_server_url.rstrip("/") + path,
            json=body,
            headers={"Authorization": f"Bearer {credentials}"},
        )
        response.raise_for_status()
        status = response.json().get("status") or {}
        if not isinstance(status, dict):
            raise ValueError("review status is not an object")
        return status

    async def _decide(self, token: str) -> bool:
        settings = self.settings
        spec: dict[str, Any] = {"token": token}
        if settings.audiences:
            spec["audiences"] = settings.audiences
        status = await self._post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec},
        )
        if status.get("authenticated") is not True:
            return False
        if settings.audiences and not set(status.get("audiences") or []) & set(settings.audiences):
            return False
        user = status.get("user") or {}
        groups = list(user.get("groups") or [])
        if settings.allowed_groups and not set(groups) & set(settings.allowed_groups):
            return False
        if settings.authorization_path is None:
            return True
        access = await self._post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.get("username"),
                    "uid": user.get("uid"),
                    "groups": groups,
                    "extra": user.get("extra") or {},
                    "nonResourceAttributes": {"path": settings.authorization_path, "verb": "get"},
                },
            },
        )
        return access.get("allowed") is True


def authenticators(settings: AuthSettings) -> list[Authenticator]:
    """What the settings enable; an empty list leaves the token-protected routes open."""
    found: list[Authenticator] = []
    if settings.token_file is not None:
        found.append(TokenFile(settings.token_file))
    if settings.token_review:
        found.append(TokenReviewer(settings))
    return found


async def require_token(request: Request) -> None:
    """Dependency of /api/v1, /metrics and the API docs: a 401 unless auth is off or an authenticator accepts the
    bearer token (429 when asking would pass the TokenReview rate)."""
    enabled: list[Authenticator] = request.app.state.authenticators
    if not enabled:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        for authenticator in enabled:
            if await authenticator.accepts(token):
                return
    raise HTTPException(status_code=401, detail="bearer token required", headers={"WWW-Authenticate": "Bearer"})


async def require_client_certificate(request: Request) -> None:
    """Dependency of /mutate and /scheduler/*: with serve.client_ca_file set, only a client whose certificate that CA
    signed (and, if listed, with one of serve.client_names as its common name) gets an answer."""
    serve: ServeSettings = request.app.state.settings.serve
    if serve.client_ca_file is None:
        return
    tls = request.scope.get("extensions", {}).get("tls", {})
    name = tls.get("client_common_name")
    if name is None:
        raise ClientCertificateError("a client certificate signed by serve.client_ca_file is required")
    if serve.client_names and name not in serve.client_names:
        raise ClientCertificateError(f"client certificate {name!r} is not one of serve.client_names")
