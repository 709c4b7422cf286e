"""Who may call what: bearer tokens (a static token file, Kubernetes TokenReview, or both) for everything that
reveals a recommendation to a person or a scraper, and client certificates for the webhook and extender routes.

TokenReview runs on the event loop (an async client), never on the thread pool that sync routes use, so slow
reviews cannot make probes wait; its answers are cached (accepted and refused, each with its own TTL, bounded in
size), its calls are rate-limited and bounded in number in flight, and an accepted token can further be required
to carry an audience, belong to a group or pass a SubjectAccessReview.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
from fastapi import HTTPException, Request

from recommender.errors import AccessDeniedError, ClientCertificateError, RateLimitedError
from serving.settings import AuthSettings, ServeSettings

log = logging.getLogger(__name__)


class Verdict(enum.Enum):
    """What an authenticator makes of a token: 200, 403 or 401."""

    ACCEPTED = "accepted"
    FORBIDDEN = "forbidden"  # authenticated, but not allowed to read
    REFUSED = "refused"  # not authenticated


class Authenticator(Protocol):
    async def judge(self, token: str, source: str) -> Verdict: ...


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

    async def judge(self, token: str, source: str) -> Verdict:
        try:
            expected = self.token()
        except OSError:
            return Verdict.REFUSED  # no readable token file: nobody gets in rather than everybody
        return Verdict.ACCEPTED if expected and hmac.compare_digest(token.encode(), expected) else Verdict.REFUSED


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


@dataclass
class Lane:
    """A budget of API server calls (rate and calls in flight), so one kind of caller cannot spend another's."""

    bucket: TokenBucket
    in_flight: asyncio.Semaphore


@dataclass
class Known:
    """The last verdict on a token the API server authenticated (accepted or forbidden), until when it holds and when
    to refresh it (accepted ones only)."""

    verdict: Verdict
    expires: float
    refresh_at: float


class TokenReviewer:
    """Asks the API server whether a token is valid (TokenReview) and, where configured, allowed (audience, group,
    SubjectAccessReview). A failure to ask (network, TLS, timeout, a non-2xx answer) refuses and is not cached.

    No lockout: a token accepted before is re-reviewed on a budget of its own, in the background once half its cache
    time has passed (it is served from the cache meanwhile), so a flood of other tokens can never make it wait or
    answer 429. Every other token spends a budget per client address, then one shared by all."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self._known: OrderedDict[str, Known] = OrderedDict()
        self._refused: OrderedDict[str, float] = OrderedDict()
        self._sources: OrderedDict[str, TokenBucket] = OrderedDict()
        self._known_lane = Lane(
            TokenBucket(settings.token_review_known_rate_per_second),
            asyncio.Semaphore(settings.token_review_concurrency),
        )
        self._unknown_lane = Lane(
            TokenBucket(settings.token_review_rate_per_second), asyncio.Semaphore(settings.token_review_concurrency)
        )
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        self._client: httpx.AsyncClient | None = None

    async def judge(self, token: str, source: str) -> Verdict:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        known = self._known.get(key)
        if known is not None:
            if now < known.expires:
                if known.verdict is Verdict.ACCEPTED and now >= known.refresh_at and key not in self._refreshing:
                    self._refreshing[key] = asyncio.create_task(self._refresh(key, token))
                return known.verdict
            if known.verdict is Verdict.ACCEPTED:
                return await self._review(key, token, self._known_lane)
        # Unknown, refused, or forbidden (any account can mint tokens that are valid but not allowed): no own budget.
        refused_until = self._refused.get(key)
        if refused_until is not None and now < refused_until:
            return Verdict.REFUSED
        if not self._source_bucket(source).take():
            raise RateLimitedError(f"too many unknown tokens from {source}; retry in a second")
        return await self._review(key, token, self._unknown_lane)

    async def close(self) -> None:
        for task in list(self._refreshing.values()):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _source_bucket(self, source: str) -> TokenBucket:
        bucket = self._sources.get(source)
        if bucket is None:
            bucket = self._sources[source] = TokenBucket(self.settings.token_review_rate_per_source)
            while len(self._sources) > self.settings.token_review_cache_entries:
                self._sources.popitem(last=False)
        self._sources.move_to_end(source)
        return bucket

    async def _review(self, key: str, token: str, lane: Lane) -> Verdict:
        """Ask the API server on `lane`'s budget and remember the answer; a failure to ask refuses, uncached."""
        try:
            async with lane.in_flight:
                verdict = await self._decide(token, lane.bucket)
        except (OSError, httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("TokenReview failed, request refused: %s", error)
            return Verdict.REFUSED
        self._remember(key, verdict)
        return verdict

    async def _refresh(self, key: str, token: str) -> None:
        """Re-review an accepted token before its entry expires; on any failure the entry stands until it does."""
        try:
            await self._review(key, token, self._known_lane)
        except RateLimitedError:
            log.warning("refresh of an accepted token postponed: the known-token budget is spent")
        finally:
            self._refreshing.pop(key, None)

    def _remember(self, key: str, verdict: Verdict) -> None:
        now, limit = time.monotonic(), self.settings.token_review_cache_entries
        if verdict is Verdict.REFUSED:
            self._known.pop(key, None)
            self._refused[key] = now + self.settings.token_review_failure_cache_seconds
            self._refused.move_to_end(key)
            while len(self._refused) > limit:
                self._refused.popitem(last=False)
            return
        self._refused.pop(key, None)
        ttl = (
            self.settings.token_review_cache_seconds
            if verdict is Verdict.ACCEPTED
            else self.settings.token_review_failure_cache_seconds
        )
        self._known[key] = Known(verdict, now + ttl, now + ttl / 2)
        self._known.move_to_end(key)
        while len(self._known) > limit:
            self._known.popitem(last=False)

    async def _post(self, path: str, body: dict[str, Any], bucket: TokenBucket) -> dict[str, Any]:
        """The `status` of a review the API server answered."""
        if not bucket.take():
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

    async def _decide(self, token: str, bucket: TokenBucket) -> Verdict:
        settings = self.settings
        spec: dict[str, Any] = {"token": token}
        if settings.audiences:
            spec["audiences"] = settings.audiences
        status = await self._post(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec},
            bucket,
        )
        if status.get("authenticated") is not True:
            return Verdict.REFUSED
        if settings.audiences and not set(status.get("audiences") or []) & set(settings.audiences):
            return Verdict.REFUSED
        user = status.get("user") or {}
        groups = list(user.get("groups") or [])
        if settings.allowed_groups and not set(groups) & set(settings.allowed_groups):
            return Verdict.FORBIDDEN
        if settings.authorization_path is None:
            return Verdict.ACCEPTED
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
            bucket,
        )
        return Verdict.ACCEPTED if access.get("allowed") is True else Verdict.FORBIDDEN


def authenticators(settings: AuthSettings) -> list[Authenticator]:
    """What the settings enable; an empty list leaves the token-protected routes open."""
    found: list[Authenticator] = []
    if settings.token_file is not None:
        found.append(TokenFile(settings.token_file))
    if settings.token_review:
        found.append(TokenReviewer(settings))
    return found


async def require_token(request: Request) -> None:
    """Dependency of /api/v1, /metrics and the API docs: nothing when auth is off or an authenticator accepts the
    bearer token; 403 when it is authenticated but not allowed, 401 otherwise (429 when asking would pass the
    TokenReview budgets)."""
    enabled: list[Authenticator] = request.app.state.authenticators
    if not enabled:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token:
        source = request.client.host if request.client is not None else ""
        verdicts: set[Verdict] = set()
        for authenticator in enabled:
            verdict = await authenticator.judge(token, source)
            if verdict is Verdict.ACCEPTED:
                return
            verdicts.add(verdict)
        if Verdict.FORBIDDEN in verdicts:
            raise AccessDeniedError(request.app.state.settings.auth.authorization_path)
    raise HTTPException(status_code=401, detail="bearer token required", headers={"WWW-Authenticate": "Bearer"})


async def require_client_certificate(request: Request) -> None:
    """Dependency of /mutate and /scheduler/*: with serve.client_ca_file set, only a client whose certificate that CA
    signed (and, if listed, with one of serve.client_names as its common name) gets an answer."""
    check_client_certificate(request.scope, request.app.state.settings.serve)


def check_client_certificate(scope: Mapping[str, Any], serve: ServeSettings) -> None:
    """`require_client_certificate` on an ASGI scope: `ClientCertificateError` unless the client may call."""
    if serve.client_ca_file is None:
        return
    tls = scope.get("extensions", {}).get("tls", {})
    name = tls.get("client_common_name")
    if name is None:
        raise ClientCertificateError("a client certificate signed by serve.client_ca_file is required")
    if serve.client_names and name not in serve.client_names:
        raise ClientCertificateError(f"client certificate {name!r} is not one of serve.client_names")
