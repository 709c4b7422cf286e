"""Assembly of Prometheus answers into tidy rows: owner chains and what happens when one batch fails."""

from __future__ import annotations

from urllib.parse import parse_qs

import httpx

from pipelines.prometheus import PrometheusClient
from pipelines.prometheus_source import PrometheusSource
from recommender.settings import PrometheusSettings

PODS = {"a": ["a-web-5d4f8b9c7-x1x1x"], "b": ["b-batch-1"]}


def matrix(namespace: str, column: str) -> dict[str, object]:
    result = [
        {"metric": {"namespace": namespace, "pod": pod, "container": "main"}, "values": [[600, "1.5"], [900, "2.0"]]}
        for pod in PODS[namespace]
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def handler(request: httpx.Request) -> httpx.Response:
    form = {k: v for k, v in parse_qs(request.content.decode()).items()}
    path = request.url.path
    if path.endswith("/series"):
        match = form["match[]"][0]
        if match.startswith("container_memory_working_set_bytes"):
            data = [{"namespace": ns, "pod": pod, "container": "main"} for ns, pods in PODS.items() for pod in pods]
        elif match.startswith("kube_pod_owner"):
            data = [
                {"namespace": "a", "pod": PODS["a"][0], "owner_kind": "ReplicaSet", "owner_name": "a-web-5d4f8b9c7", "owner_is_controller": "true"},
                {"namespace": "b", "pod": "b-batch-1", "owner_kind": "Job", "owner_name": "b-batch", "owner_is_controller": "true"},
            ]
        elif match.startswith("kube_replicaset_owner"):
            data = [{"namespace": "a", "replicaset": "a-web-5d4f8b9c7", "owner_kind": "Deployment", "owner_name": "web"}]
        else:
            data = []
        return httpx.Response(200, json={"status": "success", "data": data})
    query = form["query"][0]
    if path.endswith("/query_range"):
        if 'namespace=~"b"' in query:
            return httpx.Response(503, json={"status": "error", "error": "overloaded"})
        if "namespace=~" in query:
            return httpx.Response(200, json=matrix("a", "x"))
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": []}})
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})


def test_a_failed_batch_is_skipped_by_name_and_the_rest_is_read() -> None:
    settings = PrometheusSettings(url="http://prom.test", retries=0, max_series_per_query=1)
    with PrometheusClient(settings, transport=httpx.MockTransport(handler)) as client:
        read = PrometheusSource(client, settings).read(0, 900, lambda _: None)
    assert set(read.skipped) == {"b/*"} and "overloaded" in read.skipped["b/*"]
    assert set(read.usage["namespace"]) == {"a"}
    assert read.workload_kinds == {("a", "web"): "Deployment"}
    assert list(read.usage["cpu_cores"]) == [1.5, 2.0]
