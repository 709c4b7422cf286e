"""A gentle Prometheus HTTP API client: POST with the query in the body, time-chunked ranges, bounded concurrency,
per-query timeouts, jittered retries for transient failures only, and an account of what it cost.

prometheus-api-client sends POSTed queries in the URL, which is what POST is meant to avoid on big selectors,
so the few endpoints we need are spoken to directly with httpx.

Range answers are decoded as they arrive (`MatrixDecoder`): the body is never held whole and no Python object is
made per point. A series' labels and the answer's envelope are parsed by orjson; its `[time, "value"]` pairs are
turned into CSV text and parsed in blocks by pyarrow's C++ reader into float64 arrays. Measured on 4,032-point
series (docs/benchmarks.md): about 1 ms a series, where `orjson.loads` of the whole answer plus float conversion
took 9 ms and ijson's C backend 4.7 ms.
"""

from __future__ import annotations

import io
import logging
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from pipelines.settings import PrometheusSettings
from recommender.arrays import FloatArray
from recommender.errors import PrometheusError

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
        return {
            "queries": self.queries,
            "retries": self.retries,
            "bytes": self.bytes,
            "query_seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class RangeQuery:
    """One range query: PromQL, first and last step (Unix seconds), step, and at most `max_steps` steps an answer
    (None: Prometheus' limit, `max_points_per_series`)."""

    promql: str
    start: int
    end: int
    step: int
    max_steps: int | None = None


@dataclass(frozen=True)
class Series:
    """One series of a range answer: its labels and parallel arrays of times (Unix seconds) and values (NaN for
    Prometheus' NaN)."""

    labels: Labels
    times: FloatArray
    values: FloatArray


#: A JSON string (group 1; group 2 is its closing quote, empty when the buffer ends inside it) or a bracket.
_TOKEN = re.compile(rb'("(?:[^"\\]|\\.)*)("?)|[{}\[\]]')
_COLON_ARRAY = re.compile(rb"\s*:\s*\[")
_EMPTY_REST = re.compile(rb"\s*\]")
_PAIRS_END = re.compile(rb"\]\s*\]")
_SKIP = re.compile(rb"[\s,]*")
_BLANKS = b" \t\r\n"
_PAIRS_TO_CSV = bytes.maketrans(b"]", b"\n")
_PAIR_COLUMNS = pacsv.ReadOptions(column_names=["_", "t", "v"])
_PAIR_TYPES = pacsv.ConvertOptions(column_types={"t": pa.float64(), "v": pa.float64()}, include_columns=["t", "v"])
#: Values text parsed in one pyarrow call (a block of series), and the most an answer may hold outside its result.
_BLOCK_BYTES = 4 << 20
#: Bytes read from the socket at a time.
_CHUNK_BYTES = 1 << 20
_ENVELOPE_BYTES = 1 << 20


class MatrixDecoder:
    """Incremental decoder of a `/api/v1/query_range` answer: `feed` it the body's chunks as they come, in any
    sizes; it returns the series completed so far, and `close` checks the envelope (status, result type) and that
    the answer was whole. Holds at most the current chunk, one unfinished series and a block of values text.

    Errors are `PrometheusError`s naming `what` (the query): invalid JSON, a pair that is not [time, "number"],
    a truncated answer. Whitespace and key order are free, as JSON allows.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._buffer = bytearray()
        self._envelope = bytearray()
        self._state = "head"  # head -> items -> tail
        self._labels: list[Labels] = []
        self._pairs: list[bytes] = []
        self._counts: list[int] = []
        self._pending_bytes = 0
        self.received = 0

    def _fail(self, problem: str) -> PrometheusError:
        return PrometheusError(f"{self.what}: {problem}")

    def feed(self, chunk: bytes) -> list[Series]:
        self.received += len(chunk)
        self._buffer += chunk
        out: list[Series] = []
        if self._state == "head":
            self._find_result()
        if self._state == "items":
            self._take_items(out)
        if self._state == "tail":
            self._envelope += self._buffer
            self._buffer.clear()
            if len(self._envelope) > _ENVELOPE_BYTES:
                raise self._fail("the answer holds more than 1 MiB besides its series")
        return out

    def close(self) -> list[Series]:
        """The last series; raises if the answer stopped early or its envelope is not a successful matrix."""
        if self._state == "head":
            self._envelope += self._buffer
        elif self._state == "items":
            raise self._fail(f"the answer ended after {self.received} bytes, inside its result (truncated)")
        try:
            body = orjson.loads(bytes(self._envelope))
        except orjson.JSONDecodeError:
            if self._state == "head" and not self._envelope.strip():
                raise self._fail("the answer is empty") from None
            raise self._fail(f"the answer is not valid JSON or was cut short (after {self.received} bytes)") from None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(body, dict) or body.get("status") != "success" or not isinstance(data, dict):
            raise self._fail(f"unexpected answer: {str(body)[:200]}")
        if data.get("resultType") != "matrix":
            raise self._fail(f"expected a matrix, got {data.get('resultType')}")
        if self._state == "head":
            raise self._fail("the answer has no result list")
        for warning in body.get("warnings") or []:
            log.warning("%s: Prometheus warns: %s", self.what, warning)
        out: list[Series] = []
        self._flush(out)
        return out

    def _find_result(self) -> None:
        """Move past the envelope's head up to the `[` of data.result (kept, to check the envelope at the end)."""
        depth, position = 0, 0
        buffer = self._buffer
        while (token := _TOKEN.search(buffer, position)) is not None:
            if token.group(1) is not None:
                if not token.group(2):
                    break  # a string cut by the chunk's end: wait for more
                position = token.end()
                if depth == 2 and token.group(1) == b'"result':
                    after = _COLON_ARRAY.match(buffer, position)
                    if after is None and _cut_after_key(buffer, position):
                        break
                    if after is not None:
                        self._envelope += buffer[: after.end()]
                        del buffer[: after.end()]
                        self._state = "items"
                        return
                continue
            depth += 1 if token.group(0) in (b"{", b"[") else -1
            position = token.end()
        if len(buffer) > _ENVELOPE_BYTES:
            raise self._fail("no result list in the first 1 MiB of the answer")

    def _take_items(self, out: list[Series]) -> None:
        buffer = self._buffer
        position = 0
        while True:
            position = _SKIP.match(buffer, position).end()  # type: ignore[union-attr]
            if position >= len(buffer):
                break
            opener = buffer[position]
            if opener == ord("]"):
                self._state = "tail"
                break
            if opener != ord("{"):
                raise self._fail(f"unexpected {chr(opener)!r} in the result list")
            end = self._item(position)
            if end is None:
                break
            position = end
            if self._pending_bytes >= _BLOCK_BYTES:
                self._flush(out)
        del buffer[:position]

    def _item(self, start: int) -> int | None:
        """Decode one series object starting at `start`; its end, or None when the buffer holds only part of it."""
        buffer = self._buffer
        depth, position = 0, start
        pairs: tuple[int, int] | None = None
        while True:
            token = _TOKEN.search(buffer, position)
            if token is None:
                return None
            if token.group(1) is not None:
                if not token.group(2):
                    return None
                position = token.end()
                if depth == 1 and token.group(1) == b'"values':
                    after = _COLON_ARRAY.match(buffer, position)
                    if after is None:
                        return None if _cut_after_key(buffer, position) else self._bad_item(start)
                    close = _pairs_end(buffer, after.end())
                    if close is None:
                        return None
                    pairs = (after.end() - 1, close)
                    position = close
                continue
            depth += 1 if token.group(0) in (b"{", b"[") else -1
            position = token.end()
            if depth == 0:
                break
        if pairs is None:
            return self._bad_item(start)
        head = bytes(buffer[start : pairs[0]]) + b"[]" + bytes(buffer[pairs[1] : position])
        try:
            item = orjson.loads(head)
        except orjson.JSONDecodeError:
            return self._bad_item(start)
        labels = item.get("metric")
        if not isinstance(labels, dict):
            return self._bad_item(start)
        text = bytes(buffer[pairs[0] + 1 : pairs[1] - 1]).strip()
        # `[t,"v"],[t,"v"]` -> `,t,v\n,t,v\n`: one pass makes CSV lines of three fields for pyarrow (the first empty;
        # value strings hold no brackets or quotes).
        lines = b"," + text.translate(_PAIRS_TO_CSV, b'["' + _BLANKS) if text else b""
        self._labels.append(labels)
        self._counts.append(lines.count(b"\n"))
        if lines:
            self._pairs.append(lines)
            self._pending_bytes += len(lines)
        return position

    def _bad_item(self, start: int) -> int:
        raise self._fail(f"a series is not valid JSON: {bytes(self._buffer[start : start + 120])!r}")

    def _flush(self, out: list[Series]) -> None:
        """Parse the values text of the pending series in one pyarrow call and hand out the series."""
        if not self._labels:
            return
        expected = sum(self._counts)
        if expected:
            try:
                # The system allocator, not Arrow's mimalloc pool, which keeps what the decoded arrays held once
                # they are freed: a streamed read would otherwise grow by every batch's arrays.
                table = pacsv.read_csv(
                    io.BytesIO(b"".join(self._pairs)),
                    read_options=_PAIR_COLUMNS,
                    convert_options=_PAIR_TYPES,
                    memory_pool=pa.system_memory_pool(),
                )
            except pa.ArrowInvalid as error:
                raise self._fail(
                    f'a sample is not a [time, "number"] pair ({str(error).splitlines()[0][:160]})'
                ) from None
            if table.num_rows != expected:
                raise self._fail(f"expected {expected} samples, decoded {table.num_rows}")
            times = table.column("t").to_numpy()
            values = table.column("v").to_numpy(zero_copy_only=False)
        else:
            times = values = np.zeros(0)
        if np.isnan(times).any():
            raise self._fail("a sample has no time")
        offset = 0
        for labels, count in zip(self._labels, self._counts):
            out.append(
                Series(
                    {str(k): str(v) for k, v in labels.items()},
                    times[offset : offset + count],
                    values[offset : offset + count],
                )
            )
            offset += count
        self._labels, self._pairs, self._counts, self._pending_bytes = [], [], [], 0


def _pairs_end(buffer: bytearray, start: int) -> int | None:
    """End of the `[time, "value"]` pairs array whose `[` is just before `start`, or None when not in the buffer yet:
    the first `]]` (the pairs hold no other brackets), found by `find` unless the answer is pretty-printed."""
    empty = _EMPTY_REST.match(buffer, start)
    if empty is not None:
        return empty.end()
    if any(byte in _BLANKS for byte in buffer[start : start + 64]):
        close = _PAIRS_END.search(buffer, start)
        return close.end() if close is not None else None
    found = buffer.find(b"]]", start)
    return found + 2 if found >= 0 else None


def _cut_after_key(buffer: bytearray, position: int) -> bool:
    """Whether the buffer ends right after a key (blanks or the colon only): the rest is still to come."""
    return bytes(buffer[position:]).strip() in (b"", b":")


def decode_matrix(chunks: Iterable[bytes], what: str) -> list[Series]:
    """Every series of a range answer given as chunks (see `MatrixDecoder`)."""
    decoder = MatrixDecoder(what)
    out = [series for chunk in chunks for series in decoder.feed(chunk)]
    return out + decoder.close()


class _Transient(Exception):
    """A failure worth retrying (connection trouble, 5xx, 429)."""


def _is_transient(error: BaseException) -> bool:
    return isinstance(error, _Transient)


def time_chunks(start: int, end: int, step: int, max_points: int) -> list[tuple[int, int]]:
    """Split [start, end] into the fewest ranges of at most `max_points` evaluation steps each (Prometheus caps at
    11,000), of equal size but for the last's remainder: Prometheus' memory follows the largest answer in flight,
    so 4,033 steps in 1,200s go as 4 x 1,009, not 1,200 x 3 + 433."""
    if end < start:
        return []
    steps = (end - start) // step + 1
    per_chunk = -(-steps // -(-steps // max_points))
    span = (per_chunk - 1) * step
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
            raise PrometheusError(
                "no Prometheus URL configured (--prometheus-url or KOORD_RECOMMENDER_PROMETHEUS__URL)"
            )
        self.settings = settings
        self.stats = QueryStats()
        self.base_url = settings.url.rstrip("/")
        # Uncompressed unless asked: Prometheus' gzip took ~6x the CPU of evaluating and encoding a usage answer
        # (0.43 s against 0.07 s for 9 MB, docs/benchmarks.md), slower than a link of ~200 Mbit/s sends the bytes.
        headers = {} if settings.compress_answers else {"Accept-Encoding": "identity"}
        headers.update(settings.headers)
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
        # The one place range chunks are issued from: at most `concurrency` in flight, whichever threads ask.
        self._pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="prometheus-query")
        self._evaluating = threading.BoundedSemaphore(min(settings.evaluating, settings.concurrency))

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
            raise PrometheusError(
                f"cannot read basic-auth password file {settings.basic_auth_password_file}: {error}"
            ) from None
        return httpx.BasicAuth(settings.basic_auth_username, password)

    @property
    def _timeout_param(self) -> str:
        """Prometheus' own query timeout, so it stops work we no longer wait for (whole milliseconds)."""
        return f"{max(1, int(self.settings.timeout_seconds * 1000))}ms"

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        self._http.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _post(
        self,
        path: str,
        form: dict[str, str | list[str]],
        what: str,
        decode: Callable[[Iterable[bytes]], T] | None = None,
    ) -> Any:
        """POST a form, retrying transient failures with jittered exponential backoff; return the `data` field, or
        what `decode` makes of the body's chunks (it reads them as they arrive)."""
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
            return retrying(self._post_once, path, form, what, decode)
        except _Transient as error:
            raise PrometheusError(f"{what}: gave up after {settings.retries + 1} attempts: {error}") from None

    def _post_once(
        self, path: str, form: dict[str, str | list[str]], what: str, decode: Callable[[Iterable[bytes]], T] | None
    ) -> Any:
        started = time.perf_counter()
        received = 0

        def chunks(response: httpx.Response) -> Iterable[bytes]:
            nonlocal received
            for chunk in response.iter_bytes(_CHUNK_BYTES):
                received += len(chunk)
                yield chunk

        # Held until the answer's headers arrive: Prometheus evaluates and encodes a whole answer before it sends
        # them, so this bounds the answers it builds at once while the others of `concurrency` stream to us.
        self._evaluating.acquire()
        evaluating = True
        try:
            with self._http.stream("POST", self.base_url + path, data=form) as response:
                self._evaluating.release()
                evaluating = False
                if response.status_code != 200 or decode is None:
                    body = b"".join(chunks(response))
                else:
                    return decode(chunks(response))
        except httpx.TransportError as error:
            raise _Transient(f"{type(error).__name__}: {error or 'connection failed'} ({self.base_url})") from None
        finally:
            if evaluating:
                self._evaluating.release()
            self.stats.record(received, time.perf_counter() - started)
        if response.status_code >= 500 or response.status_code == 429:
            raise _Transient(f"HTTP {response.status_code}: {_error_text(body, response.reason_phrase)}")
        if response.status_code != 200:
            raise PrometheusError(
                f"{what}: Prometheus refused the query (HTTP {response.status_code}): {_error_text(body, response.reason_phrase)}"
            )
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise PrometheusError(f"{what}: the answer is not JSON (is {self.base_url} a Prometheus API?)") from None
        if not isinstance(answer, dict) or answer.get("status") != "success" or "data" not in answer:
            raise PrometheusError(f"{what}: unexpected answer: {str(answer)[:200]}")
        return answer["data"]

    def query(self, promql: str, at: int) -> list[tuple[Labels, float]]:
        """An instant query: (labels, value) per series."""
        data = self._post(
            "/api/v1/query", {"query": promql, "time": str(at), "timeout": self._timeout_param}, f"query {promql[:120]}"
        )
        if data.get("resultType") != "vector":
            raise PrometheusError(f"query {promql[:120]}: expected a vector, got {data.get('resultType')}")
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]

    def query_range(self, promql: str, start: int, end: int, step: int, max_steps: int | None = None) -> list[Series]:
        """A range query split into chunks of at most `max_steps` steps (see `query_ranges`)."""
        return self.query_ranges([RangeQuery(promql, start, end, step, max_steps)])[0]

    def query_ranges(self, queries: Sequence[RangeQuery]) -> list[list[Series]]:
        """Each query's series: its range split into chunks of at most `max_steps` steps (and under Prometheus'
        points limit), the chunks of all the queries issued at most `concurrency` at a time (Prometheus evaluates
        them on its cores while we decode), each answer decoded as it streams in; chunks of one series are joined
        in time order, series in the order the chunks first hold them (as one at a time gave). The first failure
        cancels what has not started and is raised."""
        issued: list[tuple[int, Future[list[Series]]]] = []
        try:
            for number, query in enumerate(queries):
                what = f"query_range {query.promql[:120]}"
                steps = min(self.settings.max_points_per_series, query.max_steps or self.settings.max_points_per_series)
                for chunk_start, chunk_end in time_chunks(query.start, query.end, query.step, max(steps, 1)):
                    form: dict[str, str | list[str]] = {
                        "query": query.promql,
                        "start": str(chunk_start),
                        "end": str(chunk_end),
                        "step": str(query.step),
                        "timeout": self._timeout_param,
                    }
                    issued.append((number, self._pool.submit(self._range_chunk, form, what)))
            merged: list[dict[tuple[tuple[str, str], ...], list[Series]]] = [{} for _ in queries]
            for number, future in issued:
                for series in future.result():
                    merged[number].setdefault(tuple(sorted(series.labels.items())), []).append(series)
        finally:
            for _, future in issued:
                future.cancel()
        return [
            [
                parts[0]
                if len(parts) == 1
                else Series(
                    parts[0].labels,
                    np.concatenate([p.times for p in parts]),
                    np.concatenate([p.values for p in parts]),
                )
                for parts in one.values()
            ]
            for one in merged
        ]

    def _range_chunk(self, form: dict[str, str | list[str]], what: str) -> list[Series]:
        result: list[Series] = self._post("/api/v1/query_range", form, what, lambda chunks: decode_matrix(chunks, what))
        return result

    def series(self, matchers: Sequence[str], start: int, end: int) -> list[Labels]:
        """Label sets of the series matching any selector in [start, end] (index only: cheap for Prometheus)."""
        form: dict[str, str | list[str]] = {"match[]": list(matchers), "start": str(start), "end": str(end)}
        data = self._post("/api/v1/series", form, f"series {', '.join(matchers)[:120]}")
        if not isinstance(data, list):
            raise PrometheusError("series: expected a list of label sets")
        return data


def _error_text(body: bytes, reason: str) -> str:
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode("utf-8", "replace") or reason
    return str(answer.get("error") or answer if isinstance(answer, dict) else answer)[:300]
