"""The client's discipline: POST bodies, time chunks under the points limit, retries only for transient errors."""

from __future__ import annotations

import base64
import itertools
import socket
import tempfile
import threading
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.prometheus import PrometheusClient, RangeQuery, time_chunks
from pipelines.settings import PrometheusSettings
from recommender.errors import PrometheusError

VECTOR = {
    "status": "success",
    "data": {"resultType": "vector", "result": [{"metric": {"a": "b"}, "value": [1, "2.5"]}]},
}


def client(handler, **overrides) -> PrometheusClient:  # type: ignore[no-untyped-def]
    settings = PrometheusSettings(
        url="http://prom.test", retries=2, backoff_initial_seconds=0.001, backoff_max_seconds=0.01, **overrides
    )
    return PrometheusClient(settings, transport=httpx.MockTransport(handler))


@given(st.integers(0, 10**9), st.integers(0, 10**7), st.integers(60, 3600), st.integers(2, 11000))
@settings(deadline=None)
def test_chunks_cover_the_range_within_the_points_limit(start: int, length: int, step: int, max_points: int) -> None:
    end = start + length
    chunks = time_chunks(start, end, step, max_points)
    # Prometheus evaluates at chunk_start + k x step <= chunk_end: together exactly the whole range's points.
    points = [t for a, b in chunks for t in range(a, b + 1, step)]
    assert points[0] == start and points[-1] == start + (length // step) * step
    assert len(points) == length // step + 1 and all(b - a == step for a, b in itertools.pairwise(points))
    assert all((b - a) // step + 1 <= max_points for a, b in chunks)
    # The fewest chunks the limit allows, none more than one step larger than another but the last (smaller).
    sizes = [(b - a) // step + 1 for a, b in chunks]
    assert len(chunks) == -(-len(points) // max_points)
    assert len(set(sizes[:-1])) <= 1 and sizes[-1] <= sizes[0]


def test_query_goes_in_the_post_body_with_auth_and_headers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=VECTOR)

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with client(handler, bearer_token_file=token, headers={"X-Scope-OrgID": "team-a"}) as prom:
        assert prom.query('up{job="x"}', at=100) == [({"a": "b"}, 2.5)]
        assert prom.stats.queries == 1
    request = seen[0]
    assert request.method == "POST" and request.url.query == b""
    assert parse_qs(request.content.decode())["query"] == ['up{job="x"}']
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.headers["X-Scope-OrgID"] == "team-a"


@given(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=":\r\n"), min_size=1, max_size=20),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=40),
)
@settings(deadline=None, max_examples=30)
def test_basic_auth_sends_the_user_and_the_password_file(username: str, password: str) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=VECTOR)

    with tempfile.TemporaryDirectory() as directory:
        secret = Path(directory) / "password"
        secret.write_text(password + "\n", encoding="utf-8")  # a mounted Secret often ends in a newline
        with client(handler, basic_auth_username=username, basic_auth_password_file=secret) as prom:
            prom.query("up", at=1)
    scheme, _, credentials = seen[0].headers["Authorization"].partition(" ")
    assert scheme == "Basic" and base64.b64decode(credentials).decode() == f"{username}:{password}"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"basic_auth_username": "u"}, "needs both basic_auth_username and basic_auth_password_file"),
        (
            {"basic_auth_username": "u", "basic_auth_password_file": "/nonexistent/password"},
            "cannot read basic-auth password file /nonexistent/password",
        ),
        (
            {"basic_auth_username": "u", "basic_auth_password_file": "/dev/null", "bearer_token": "t"},
            "either a bearer token or basic authentication",
        ),
    ],
)
def test_basic_auth_misconfigurations_are_one_line(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(PrometheusError, match=message):
        client(lambda request: httpx.Response(200, json=VECTOR), **overrides)


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_transient_errors_are_retried(status: int) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(status, json={"error": "busy"}) if len(calls) < 3 else httpx.Response(200, json=VECTOR)

    with client(handler) as prom:
        assert prom.query("up", at=1)
        assert prom.stats.retries == 2
    assert len(calls) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_not_retried(status: int) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(status, json={"status": "error", "error": "parse error at char 3"})

    with client(handler) as prom, pytest.raises(PrometheusError, match=f"HTTP {status}.*parse error"):
        prom.query("up{", at=1)
    assert len(calls) == 1


def test_retries_are_bounded() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="overloaded")

    with client(handler) as prom, pytest.raises(PrometheusError, match="gave up after 3 attempts"):
        prom.query("up", at=1)


def test_garbage_answers_are_clear() -> None:
    with client(lambda r: httpx.Response(200, text="<html>")) as prom, pytest.raises(PrometheusError, match="not JSON"):
        prom.query("up", at=1)
    with client(
        lambda r: httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": []}})
    ) as prom:
        with pytest.raises(PrometheusError, match="expected a vector"):
            prom.query("up", at=1)


def test_a_silent_server_times_out() -> None:
    """A loopback socket that accepts and never answers: the per-query timeout ends the wait."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        settings = PrometheusSettings(
            url=f"http://127.0.0.1:{listener.getsockname()[1]}",
            timeout_seconds=0.5,
            retries=1,
            backoff_initial_seconds=0.01,
        )
        with PrometheusClient(settings) as prom, pytest.raises(PrometheusError, match="ReadTimeout"):
            prom.query("up", at=1)
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in accepted:
            conn.close()
        listener.close()


# -- queries in flight and compression (issue 17) --------------------------------------------------------------------


def chunk_answer(request: httpx.Request) -> httpx.Response:
    """A matrix answer of one series `{job="x"}` whose value at each step of the asked range is its time / 300."""
    form = parse_qs(request.content.decode())
    start, end, step = (int(form[k][0]) for k in ("start", "end", "step"))
    values = [[t, str(t / 300)] for t in range(start, end + 1, step)]
    result = [{"metric": {"job": "x"}, "values": values}]
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": result}})


@pytest.mark.parametrize(("concurrency", "evaluating"), [(1, 1), (2, 2), (3, 3), (3, 2), (2, 1)])
def test_range_chunks_go_concurrency_at_a_time_and_join_in_time_order(concurrency: int, evaluating: int) -> None:
    """Six chunks of two queries: every answer waits until `evaluating` requests are at the server at once (a
    barrier, so the overlap is proven, not timed), never more (a mock answers headers and body at once, so a
    request is at the server until it is answered); each query's series is its whole range in order."""
    together = threading.Barrier(evaluating, timeout=10)
    lock = threading.Lock()
    in_flight, most = 0, 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        try:
            together.wait()
            return chunk_answer(request)
        finally:
            with lock:
                in_flight -= 1

    queries = [RangeQuery("a", 0, 2700, 300, 4), RangeQuery("b", 0, 2700, 300, 4)]  # 10 steps: 3 chunks each
    with client(handler, concurrency=concurrency, evaluating=evaluating) as prom:
        answers = prom.query_ranges(queries)
        assert prom.stats.queries == 6
    assert most == evaluating
    for answer in answers:
        [series] = answer
        assert series.labels == {"job": "x"}
        assert series.times.tolist() == list(range(0, 3000, 300))
        assert series.values.tolist() == [t / 300 for t in range(0, 3000, 300)]


def test_a_failed_chunk_fails_the_call_by_name_and_the_client_stays_usable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if parse_qs(request.content.decode())["start"] == ["1200"]:
            return httpx.Response(422, json={"status": "error", "error": "bad chunk"})
        return chunk_answer(request)

    with client(handler, concurrency=2) as prom:
        with pytest.raises(PrometheusError, match=r"^query_range up: Prometheus refused the query \(HTTP 422\)"):
            prom.query_range("up", 0, 2700, 300, 4)
        assert len(prom.query_range("up", 0, 900, 300, 4)[0].times) == 4


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, "identity"),
        ({"compress_answers": True}, "gzip"),
        ({"headers": {"Accept-Encoding": "br"}}, "br"),
    ],
)
def test_answers_are_uncompressed_unless_asked(overrides: dict[str, object], expected: str) -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Accept-Encoding"])
        return chunk_answer(request)

    with client(handler, **overrides) as prom:
        prom.query_range("up", 0, 600, 300)
    assert expected in seen[0].split(", ") and (expected != "identity" or seen[0] == "identity")
