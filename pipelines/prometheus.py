"""A gentle Prometheus HTTP API client: POST with the query in the body, time-chunked ranges, bounded concurrency,
per-query timeouts, jittered retries for transient failures only, and an account of what it cost.

prometheus-api-client sends POSTed queries in the URL, which is what POST is meant to avoid on big selectors,
so the few endpoints we need are spoken to directly with httpx.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import orjson
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from recommender.errors import PrometheusError
from recommender.settings import PrometheusSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
Labels = dict[str, str]


@dataclass
class QueryStats:
    """What a run asked of Prometheus; reported at the end of every run."""

    queries: int = 0
    retries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, received: int, seconds: float) -> None:
        with self._lock:
            self.queries += 1
            self.bytes += received
            self.seconds += seconds

    def retried(self) -> None:
        with self._lock:
            self.retries += 1

    def summary(self) -> dict[str, float]:
        return {"queries": self.queries, "retries": self.retries, "bytes": self.bytes, "query_seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Series:
    """One series of a range answer: its labels and parallel arrays of times (Unix seconds) and values."""

    labels: Labels
    times: list[float]
    values: list[float]


class _Transient(Exception):
    """A failure worth retrying (connection trouble, 5xx, 429)."""


def _is_transient(error: BaseException) -> bool:
    return isinstance(error, _Transient)


def time_chunks(start: int, end: int, step: int, max_points: int) -> list[tuple[int, int]]:
    """Split [start, end] into ranges of at most `max_points` evaluation steps each (Prometheus caps at 11,000)."""
    if end < start:
        return []
    span = (max_points - 1) * step
    chunks = []
    chunk_start = start
    while chunk_start <= end:
        chunk_end = min(chunk_start + span, end)
        chunks.append((chunk_start, chunk_end))
        chunk_start = chunk_end + step
    return chunks


class PrometheusClient:
    """Speaks /api/v1/query, /api/v1/query_range and /api/v1/series; thread-safe, bounded by `concurrency`."""

    def __init__(self, settings: PrometheusSettings, transport: httpx.BaseTransport | None = None) -> None:
        if not settings.url:
            raise PrometheusError("no Prometheus URL configured (--prometheus-url or KOORD_RECOMMENDER_PROMETHEUS__URL)")
        self.settings = settings
        self.stats = QueryStats()
        self.base_url = settings.url.rstrip("/")
        headers = dict(settings.headers)
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            headers=headers,
            auth=self._basic_auth(token),
            verify=self._tls(),
            timeout=httpx.Timeout(settings.timeout_seconds, connect=min(10.0, settings.timeout_seconds)),
            limits=httpx.Limits(max_connections=settings.concurrency, max_keepalive_connections=settings.concurrency),
            transport=transport,
        )

    def _tls(self) -> ssl.SSLContext | bool:
        """Certificate checks: our CA bundle if given, mutual TLS if a client certificate is given."""
        settings = self.settings
        if settings.insecure_skip_verify:
            return False
        try:
            context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
            if settings.client_cert_file and settings.client_key_file:
                context.load_cert_chain(str(settings.client_cert_file), str(settings.client_key_file))
        except (OSError, ssl.SSLError) as error:
            raise PrometheusError(f"cannot load the TLS files for Prometheus: {error}") from None
        return context

    def _token(self) -> str | None:
        settings = self.settings
        if settings.bearer_token_file is not None:
            try:
                return settings.bearer_token_file.read_text(encoding="utf-8").strip()
            except OSError as error:
                raise PrometheusError(f"cannot read bearer token file {settings.bearer_token_file}: {error}") from None
        return settings.bearer_token.get_secret_value() if settings.bearer_token else None

    def _basic_auth(self, token: str | None) -> httpx.BasicAuth | None:
        """User and password (read from its file) when basic authentication is configured."""
        settings = self.settings
        if settings.basic_auth_username is None and settings.basic_auth_password_file is None:
            return None
        if settings.basic_auth_username is None or settings.basic_auth_password_file is None:
            raise PrometheusError("basic authentication needs both basic_auth_username and basic_auth_password_file")
        if token:
            raise PrometheusError("give Prometheus either a bearer token or basic authentication, not both")
        try:
            password = settings.basic_auth_password_file.read_text(encoding="utf-8").rstrip("\n")
        except OSError as error:
            raise PrometheusError(f"cannot read basic-auth password file {settings.basic_auth_password_file}: {error}") from None
        return httpx.BasicAuth(settings.basic_auth_username, password)

    @property
    def _timeout_param(self) -> str:
        """Prometheus' own query timeout, so it stops work we no longer wait for (whole milliseconds)."""
        return f"{max(1, int(self.settings.timeout_seconds * 1000))}ms"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _post(self, path: str, form: dict[str, str | list[str]], what: str) -> Any:
        """POST a form, retrying transient failures with jittered exponential backoff; return the `data` field."""
        settings = self.settings

        def before_sleep(state: RetryCallState) -> None:
            self.stats.retried()
            outcome = state.outcome.exception() if state.outcome else None
            log.warning("retrying %s after: %s", what, outcome)

        retrying = Retrying(
            stop=stop_after_attempt(settings.retries + 1),
            wait=wait_random_exponential(multiplier=settings.backoff_initial_seconds, max=settings.backoff_max_seconds),
            retry=retry_if_exception(_is_transient),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            return retrying(self._post_once, path, form, what)
        except _Transient as error:
            raise PrometheusError(f"{what}: gave up after {settings.retries + 1} attempts: {error}") from None

    def _post_once(self, path: str, form: dict[str, str | list[str]], what: str) -> Any:
        started = time.perf_counter()
        try:
            response = self._http.post(self.base_url + path, data=form)
        except httpx.TransportError as error:
            raise _Transient(f"{type(error).__name__}: {error or 'connection failed'} ({self.base_url})") from None
        self.stats.record(len(response.content), time.perf_counter() - started)
        if response.status_code >= 500 or response.status_code == 429:
            raise _Transient(f"HTTP {response.status_code}: {_error_text(response)}")
        if response.status_code != 200:
            raise PrometheusError(f"{what}: Prometheus refused the query (HTTP {response.status_code}): {_error_text(response)}")
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise PrometheusError(f"{what}: the answer is not JSON (is {self.base_url} a Prometheus API?)") from None
        if not isinstance(body, dict) or body.get("status") != "success" or "data" not in body:
            raise PrometheusError(f"{what}: unexpected answer: {str(body)[:200]}")
        return body["data"]

    def query(self, promql: str, at: int) -> list[tuple[Labels, float]]:
        """An instant query: (labels, value) per series."""
        data = self._post(
            "/api/v1/query", {"query": promql, "time": str(at), "timeout": self._timeout_param}, f"query {promql[:120]}"
        )
        if data.get("resultType") != "vector":
            raise PrometheusError(f"query {promql[:120]}: expected a vector, got {data.get('resultType')}")
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]

    def query_range(self, promql: str, start: int, end: int, step: int) -> list[Series]:
        """A range query split into chunks under the points limit; chunks of one series are joined."""
        merged: dict[tuple[tuple[str, str], ...], Series] = {}
        for chunk_start, chunk_end in time_chunks(start, end, step, self.settings.max_points_per_series):
            data = self._post(
                "/api/v1/query_range",
                {
                    "query": promql,
                    "start": str(chunk_start),
                    "end": str(chunk_end),
                    "step": str(step),
                    "timeout": self._timeout_param,
                },
                f"query_range {promql[:120]}",
            )
            if data.get("resultType") != "matrix":
                raise PrometheusError(f"query_range {promql[:120]}: expected a matrix, got {data.get('resultType')}")
            for item in data["result"]:
                key = tuple(sorted(item["metric"].items()))
                series = merged.setdefault(key, Series(item["metric"], [], []))
                stamps, values = zip(*item["values"]) if item["values"] else ((), ())
                series.times.extend(map(float, stamps))
                series.values.extend(map(float, values))
        return list(merged.values())

    def series(self, matchers: Sequence[str], start: int, end: int) -> list[Labels]:
        """Label sets of the series matching any selector in [start, end] (index only: cheap for Prometheus)."""
        form: dict[str, str | list[str]] = {"match[]": list(matchers), "start": str(start), "end": str(end)}
        data = self._post("/api/v1/series", form, f"series {', '.join(matchers)[:120]}")
        if not isinstance(data, list):
            raise PrometheusError("series: expected a list of label sets")
        return data

    def map_bounded(self, function: Callable[[T], Any], items: Sequence[T]) -> list[Any]:
        """Run `function` over items with at most `concurrency` queries in flight; exceptions are returned, not raised."""

        def guarded(item: T) -> Any:
            try:
                return function(item)
            except PrometheusError as error:
                return error

        with ThreadPoolExecutor(max_workers=self.settings.concurrency) as pool:
            return list(pool.map(guarded, items))


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("error") or body)[:300]
    except ValueError:
        return response.text[:300] or response.reason_phrase
