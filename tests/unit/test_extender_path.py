"""The extender's lean path (serving.routes.extender.FastPath): the documented routes' answers byte for byte, the
client certificate still required, its metrics, and the candidate lists a cluster view remembers never outliving
the view or their bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from cli.settings import Settings
from pipelines.train import train_from_file
from serving import cluster
from serving.app import create_app
from serving.cluster import CandidateLists, Placement
from serving.routes import extender
from tests import k8s

POD = k8s.pod("deployment", "w1", [k8s.container("main", {"requests": {"cpu": "1"}})])
POD["metadata"]["namespace"] = "ns"
VERBS = ("filter", "prioritize")


def dumped(value: Any) -> bytes:
    return json.dumps(value).encode()


#: Bodies of every shape the two paths must answer alike: the scheduler's, and what only a hostile caller sends.
BODIES = [
    dumped({"Pod": POD, "NodeNames": ["busy", "idle", "strict", "ghost"]}),
    dumped({"Pod": POD, "NodeNames": ["idle", "busy", "idle"]}),
    b'{"Pod": ' + dumped(POD) + b' ,"NodeNames"  :  [ "strict" ,"busy" ] }',
    dumped({"Pod": POD, "nodenames": ["busy", "idle"]}),
    dumped({"Pod": POD, "NodeNames": ["busy", 7, None, {"a": ["idle"]}, "x]y", "idle"]}),
    dumped({"Pod": POD, "NodeNames": ['a"]b', "busy", "\u00fcn\u00ef"]}),
    b'{"Pod": ' + dumped(POD) + b', "NodeNames": ["\\u0062usy", "idle"]}',
    b'{"NodeNames": ["busy"], "Pod": ' + dumped(POD) + b', "NodeNames": ["idle", "strict"]}',
    dumped({"Pod": POD, "NodeNames": ["busy"]}),  # the text of the list overridden just before
    b'{"NodeNames": ["strict"], "nodeNames": ["idle"], "Pod": ' + dumped(POD) + b"}",
    b'{"nodeNames": ["strict"], "NodeNames": ["idle"], "Pod": ' + dumped(POD) + b"}",
    dumped({"Pod": POD, "NodeNames": ["idle"]}),
    b'{"Pod": ' + dumped(POD) + b', "NodeNames": ["busy"], "NodeNames": null}',
    b'{"Pod": {"metadata": {"name": "\\\\"}, "k": "\\"NodeNames\\": [\\"idle\\"]"}, "NodeNames": ["busy"]}',
    b'{"Pod": {"a\\"NodeNames": ["idle", "busy"]}, "NodeNames": ["strict"]}',
    b'{"Pod": {"k": "a", "NodeNames": ["idle", "busy"]}, "NodeNames": ["strict"]}',
    dumped({"Pod": POD, "NodeNames": ["idle", "busy"]}),
    b'{"Pod": ' + dumped(POD) + b', "NodeNames": ["busy"]} trailing',
    b'{"Pod": ' + dumped(POD) + b', "NodeNames": ["busy"]',
    dumped({"Pod": POD, "NodeNames": []}),
    dumped({"Pod": POD, "NodeNames": "busy"}),
    dumped({"Pod": 1, "NodeNames": ["busy"]}),
    dumped({"Pod": POD, "Nodes": k8s.listing("NodeList", [k8s.node("busy", cpu="8"), k8s.node("tiny", cpu="1")])}),
    b"]",
    b"",
    b'"NodeNames"',
]


def write_cluster(directory: Path, nodes: list[dict[str, Any]]) -> None:
    busy = k8s.pod("deployment", "w1", [k8s.container("main", {"requests": {"cpu": "1"}})])
    pods = [k8s.running(busy, "ns", "busy", f"w1-{i}") for i in range(4)]
    (directory / "pods.json").write_text(json.dumps(k8s.listing("PodList", pods)))
    (directory / "nodes.json").write_text(json.dumps(k8s.listing("NodeList", nodes)))


NODES = [k8s.node("busy", cpu="8"), k8s.node("idle", cpu="8"), k8s.node("strict", cpu="1")]


@pytest.fixture
def settings(tmp_path: Path, usage_csv: Path) -> Settings:
    found = Settings(
        store={"path": str(tmp_path / "store")},
        extender={"nodes_file": str(tmp_path / "nodes.json"), "pods_file": str(tmp_path / "pods.json")},
    )
    train_from_file(usage_csv, found)
    write_cluster(tmp_path, NODES)
    return found


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as http:
        yield http


def routes_only(app: Any) -> TestClient:
    """The extender's documented routes on the same state, without the lean path in front of them."""
    bare = FastAPI()
    bare.include_router(extender.router)
    bare.state = app.state
    return TestClient(bare)


def unremembered(client: TestClient, path: str, body: bytes) -> Any:
    """The answer on the same cluster view with no candidate list remembered (each list read and looked up)."""
    view = client.app.state.cluster  # type: ignore[attr-defined]
    kept = view.placement
    view.placement = Placement(kept.loads, kept.hosts, CandidateLists())
    try:
        return client.post(path, content=body)
    finally:
        view.placement = kept


def sample(client: TestClient, name: str, **labels: str) -> float:
    """A sample of the app's /metrics (0 while absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = (s for f in text_string_to_metric_families(client.get("/metrics").text) for s in f.samples)
    return next((s.value for s in samples if s.name == name and s.labels == labels), 0.0)


@pytest.mark.parametrize("verb", VERBS)
def test_the_lean_path_answers_and_counts_as_the_documented_routes(client: TestClient, verb: str) -> None:
    documented = routes_only(client.app)
    remembered = client.app.state.cluster.placement.candidates  # type: ignore[attr-defined]
    calls = "koord_recommender_extender_calls_total"
    for body in BODIES:
        counted = sample(client, calls, verb=verb)
        expected = unremembered(documented, f"/scheduler/{verb}", body)
        judged = sample(client, calls, verb=verb) - counted
        for _ in range(3):  # a list by names is remembered when it comes again, and answered from it after
            lean = client.post(f"/scheduler/{verb}", content=body)
            assert (lean.status_code, lean.headers, lean.content) == (
                expected.status_code,
                expected.headers,
                expected.content,
            ), body
        assert sample(client, calls, verb=verb) - counted == 4 * judged
    assert remembered.get(b'["busy", "idle", "strict", "ghost"]') is not None
    assert remembered.get(b'[ "strict" ,"busy" ]') is not None
    latency = "koord_recommender_http_request_duration_seconds_count"
    assert sample(client, latency, method="POST", route=f"/scheduler/{verb}", status="200") == 3 * len(BODIES)


def test_the_client_certificate_is_still_required(settings: Settings, tmp_path: Path) -> None:
    settings.serve.client_ca_file = (
        tmp_path / "ca.pem"
    )  # never opened here: TLS is uvicorn's, the routes read its verdict
    settings.serve.client_names = ["kube-scheduler"]
    app = create_app(settings)

    def post(verb: str, common_name: str | None) -> tuple[int, Any]:
        extensions = {} if common_name is None else {"tls": {"client_common_name": common_name}}
        status, answer = asyncio.run(asgi_post(app, f"/scheduler/{verb}", BODIES[0], extensions))
        return status, orjson.loads(answer)

    required = "a client certificate signed by serve.client_ca_file is required"
    with TestClient(app):
        for verb in VERBS:
            assert post(verb, None) == (403, {"error": "ClientCertificateError", "detail": required})
            status, refused = post(verb, "someone-else")
            assert status == 403 and "'someone-else' is not one of serve.client_names" in refused["detail"]
            status, answer = post(verb, "kube-scheduler")
            assert status == 200 and "ghost" in json.dumps(answer)


async def asgi_post(app: Any, path: str, body: bytes, extensions: dict[str, Any]) -> tuple[int, bytes]:
    """(status, body) of one POST through the ASGI app, with `extensions` in its scope as uvicorn puts them."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "https",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 443),
        "extensions": extensions,
    }
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_a_remembered_list_does_not_outlive_its_cluster_view(settings: Settings, tmp_path: Path) -> None:
    body = dumped({"Pod": POD, "NodeNames": ["busy", "late"]})
    with TestClient(create_app(settings)) as http:
        before = http.post("/scheduler/prioritize", content=body).json()
        for _ in range(2):  # remembered, then answered from it
            assert before == http.post("/scheduler/prioritize", content=body).json()
        assert http.app.state.cluster.placement.candidates.get(b'["busy", "late"]') is not None  # type: ignore[attr-defined]
        assert before[1] == {"Host": "late", "Score": 5}  # unknown: neutral
        # New nodes: `late`, and `a-tiny` before `busy`, so every column of the remembered list moves.
        write_cluster(tmp_path, [*NODES, k8s.node("a-tiny", cpu="1", memory="1Gi"), k8s.node("late", cpu="8")])
        state = http.app.state  # type: ignore[attr-defined]
        state.cluster.refresh(state.service.snapshot)
        after = http.post("/scheduler/prioritize", content=body)
        assert after.content == unremembered(http, "/scheduler/prioritize", body).content
    assert after.json() != before and after.json()[1]["Score"] > 5


def test_remembered_lists_are_bounded_least_recently_used_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "MAX_REMEMBERED_NAMES", 10)
    hosts = cluster.HostRecords(["a", "b", "c", "d"])
    lists = cluster.CandidateLists()

    def remember(text: bytes, size: int) -> None:
        lists.remember(text, cluster.Candidates(["a"] * size, np.zeros(size, dtype=np.int64), hosts))

    remember(b"first", 4)
    remember(b"second", 4)
    assert lists.get(b"first") is not None  # now the most recently used
    remember(b"third", 4)
    assert lists.get(b"second") is None and lists.get(b"first") is not None and lists.get(b"third") is not None
    remember(b"huge", 11)
    assert lists.get(b"huge") is None and lists.get(b"first") is not None


def test_lists_are_remembered_when_they_come_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "MAX_SIGHTED_LISTS", 2)
    lists = cluster.CandidateLists()
    assert [lists.sent_before(text) for text in (b"a", b"a", b"b", b"c", b"a", b"c")] == [
        False,
        True,
        False,
        False,
        False,  # `a` was forgotten when `c` came: two are tracked
        True,
    ]
