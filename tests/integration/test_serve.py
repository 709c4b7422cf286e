"""`recommender serve` as a real uvicorn process on loopback, over the store a real `train` wrote."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import k8s
from tests.conftest import Runner
from tests.integration.server import serving

pytestmark = pytest.mark.integration


@pytest.fixture
def server(cli: Runner, tmp_path: Path, usage_csv: Path) -> Iterator[str]:
    assert cli("train", "--input", str(usage_csv), "--store", "store").returncode == 0
    with serving(Path("store"), tmp_path) as base:
        yield base


def test_health_list_one_and_docs(server: str) -> None:
    assert httpx.get(server + "/healthz").json() == {"status": "ok"}
    listed = httpx.get(server + "/api/v1/recommendations").json()
    assert {r["workload"] for r in listed["recommendations"]} == {"w0", "w1"}
    filtered = httpx.get(server + "/api/v1/recommendations", params={"workload": "w1"}).json()
    assert [r["workload"] for r in filtered["recommendations"]] == ["w1"]
    one = httpx.get(server + "/api/v1/recommendations/ns/w0/main").json()
    assert len(one["cpu"]["short_term"]) == 288 and one["current"]["cpu_limit_cores"] == 2.0
    assert len(httpx.get(server + "/api/v1/recommendations/ns/w0").json()) == 1
    assert httpx.get(server + "/api/v1/version").json()["version"] == listed["version"]
    assert httpx.get(server + "/docs").status_code == 200
    assert "/api/v1/recommendations" in httpx.get(server + "/openapi.json").json()["paths"]


def test_unknown_workload_is_404_with_reason(server: str) -> None:
    response = httpx.get(server + "/api/v1/recommendations/ns/nope/main")
    assert response.status_code == 404
    assert response.json()["detail"] == "no recommendation for ns/nope/main"


def test_not_ready_without_a_model(tmp_path: Path) -> None:
    with serving(tmp_path / "empty", tmp_path, ready_status=503) as base:
        response = httpx.get(base + "/readyz")
        assert response.status_code == 503
        assert "no model version published yet" in response.json()["detail"]
        assert httpx.get(base + "/api/v1/recommendations").status_code == 503
        # The webhook still answers, and lets the pod through unchanged.
        review = k8s.review(k8s.pod("deployment", "w0", [k8s.container("main", None)]), "ns")
        answer = httpx.post(base + "/mutate", json=review).json()["response"]
        assert answer == {
            "uid": review["request"]["uid"],
            "allowed": True,
            "warnings": ["koord-recommender: no model version loaded, pod admitted unchanged"],
        }
