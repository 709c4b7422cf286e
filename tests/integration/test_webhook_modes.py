"""The opt-in over real HTTPS: a real `recommender serve` without cluster access (pod labels and the default mode
only) in dry-run, answering AdmissionReviews shaped as the API server sends them."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from recommender.mutation import APPLIED_ANNOTATION, WOULD_APPLY_ANNOTATION
from recommender.optin import MODE_KEY
from tests import k8s
from tests.conftest import DAY, make_usage
from tests.integration.test_serving_tls import tls_client, train

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    workdir = tmp_path_factory.mktemp("modes")
    frame = make_usage(workloads=1, pods=2, days=2, start=int(time.time()) - 2 * DAY)
    frame["workload"] = "web"
    train(frame, workdir, workdir / "store")
    env = {"KOORD_RECOMMENDER_WEBHOOK__DRY_RUN": "true", "KOORD_RECOMMENDER_WEBHOOK__WATCH_API": "off"}
    with tls_client(workdir, env, timeout=10) as found:
        yield found


def review(client: httpx.Client, labels: dict[str, str] | None = None) -> tuple[dict[str, object], dict[str, object]]:
    pod = k8s.pod("deployment", "web", [k8s.container("main", k8s.RESOURCE_SHAPES["both"])], labels=labels)
    answer = client.post("/mutate", json=k8s.review(pod, "ns"))
    assert answer.status_code == 200
    return answer.json()["response"], k8s.apply_response(pod, answer.json())


def test_a_pod_nobody_opted_in_is_left_alone(client: httpx.Client) -> None:
    response, _ = review(client)
    assert "patch" not in response and "warnings" not in response
    assert 'koord_recommender_webhook_decisions_total{dry_run="false",outcome="off"}' in client.get("/metrics").text


def test_dry_run_only_annotates_what_would_change(client: httpx.Client) -> None:
    _, patched = review(client, {MODE_KEY: "Initial"})
    assert patched["spec"]["containers"][0]["resources"] == k8s.RESOURCE_SHAPES["both"]  # type: ignore[index]
    annotations = patched["metadata"]["annotations"]  # type: ignore[index]
    assert APPLIED_ANNOTATION not in annotations and set(annotations) == {WOULD_APPLY_ANNOTATION}
    record = json.loads(annotations[WOULD_APPLY_ANNOTATION])
    assert record["mode"] == "Initial" and record["source"] == f"pod label {MODE_KEY}=Initial"
    assert any(change.startswith("main: cpu request 1 -> ") for change in record["changes"])
    metrics = client.get("/metrics").text
    assert 'koord_recommender_webhook_decisions_total{dry_run="false",outcome="would_patch"}' in metrics


def test_an_answer_holds_only_the_submitted_pods_own_patch(client: httpx.Client) -> None:
    """What /mutate can reveal to a caller that reaches it (docs/security.md): the patch of the pod it sent, which
    that pod would get anyway; nothing about other workloads, and nothing for a workload the model does not know."""
    response, _ = review(client, {MODE_KEY: "Initial"})
    assert set(response) <= {"uid", "allowed", "patchType", "patch", "warnings"} and response["allowed"] is True
    patch = json.loads(base64.b64decode(str(response["patch"])))
    assert {op["path"] for op in patch} <= {"/metadata/annotations", f"/metadata/annotations/{WOULD_APPLY_ANNOTATION}"}
    unknown = k8s.pod("deployment", "someone-else", [k8s.container("main", k8s.RESOURCE_SHAPES["both"])])
    unknown["metadata"]["labels"] = {**unknown["metadata"].get("labels", {}), MODE_KEY: "Initial"}
    answer = client.post("/mutate", json=k8s.review(unknown, "ns")).json()["response"]
    assert "patch" not in answer
