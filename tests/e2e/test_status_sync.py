"""`recommender sync` against a real kube-apiserver: VPA and Koordinator Recommendation statuses."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from models.store import ModelStore
from recommender.units import cpu_cores_from_quantity
from serving.controllers.status import StatusSync, SyncReport
from serving.settings import SyncSettings
from serving.state import ServiceState
from tests.conftest import Runner, entry_point, make_usage
from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.e2e
VPA = ("autoscaling.k8s.io", "v1", "verticalpodautoscalers")
REC = ("analysis.koordinator.sh", "v1alpha1", "recommendations")


def vpa(name: str, workload: str, recommender: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload},
            "recommenders": [{"name": recommender}],
            "updatePolicy": {"updateMode": "Off"},
            **spec,
        },
    }


def recommendation(name: str, workload: str) -> dict[str, Any]:
    return {
        "apiVersion": "analysis.koordinator.sh/v1alpha1",
        "kind": "Recommendation",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "target": {
                "type": "workload",
                "workload": {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload},
            }
        },
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("store")
    usage = make_usage(workloads=2, pods=2, days=3)
    usage = usage.assign(namespace="shop", workload=usage["workload"].map({"w0": "web", "w1": "api"}), container="app")
    usage.to_csv(workdir / "usage.csv", index=False)
    done = subprocess.run(
        [entry_point(), "train", "--input", str(workdir / "usage.csv"), "--store", str(workdir / "store")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return workdir / "store"


@pytest.fixture(scope="module")
def objects(plane: ControlPlane) -> client.CustomObjectsApi:
    api = plane.api()
    client.CoreV1Api(api).create_namespace({"metadata": {"name": "shop"}})
    custom = client.CustomObjectsApi(api)
    capped = {"resourcePolicy": {"containerPolicies": [{"containerName": "*", "maxAllowed": {"cpu": "300m"}}]}}
    custom.create_namespaced_custom_object(*VPA[:2], "shop", VPA[2], vpa("web", "web", "koord-recommender", **capped))
    custom.create_namespaced_custom_object(*VPA[:2], "shop", VPA[2], vpa("api-default", "api", "default"))
    custom.create_namespaced_custom_object(
        *VPA[:2], "shop", VPA[2], vpa("ghost", "no-such-workload", "koord-recommender")
    )
    custom.create_namespaced_custom_object(*REC[:2], "shop", REC[2], recommendation("web", "web"))
    return custom


def get(custom: client.CustomObjectsApi, kind: tuple[str, str, str], name: str) -> dict[str, Any]:
    found: dict[str, Any] = custom.get_namespaced_custom_object(kind[0], kind[1], "shop", kind[2], name)
    return found


def test_sync_once_writes_our_vpas_and_recommendations(
    plane: ControlPlane, store: Path, objects: client.CustomObjectsApi, cli: Runner
) -> None:
    result = cli("sync", "--once", "--store", str(store), "--kubeconfig", str(plane.kubeconfig))
    assert result.returncode == 0, result.stderr
    web = get(objects, VPA, "web")["status"]
    containers = web["recommendation"]["containerRecommendations"]
    assert [c["containerName"] for c in containers] == ["app"]
    app = containers[0]
    assert set(app) == {"containerName", "target", "lowerBound", "upperBound", "uncappedTarget"}
    assert cpu_cores_from_quantity(app["target"]["cpu"]) <= 0.3  # maxAllowed applied...
    assert cpu_cores_from_quantity(app["uncappedTarget"]["cpu"]) > 0.3  # ...but not to the uncapped target
    assert {c["type"]: c["status"] for c in web["conditions"]} == {
        "RecommendationProvided": "True",
        "LowConfidence": "False",
    }
    assert "status" not in get(objects, VPA, "api-default")  # another recommender's VPA is left alone
    ghost = get(objects, VPA, "ghost")["status"]
    assert ghost["conditions"][0]["status"] == "False" and "recommendation" not in ghost
    koord = get(objects, REC, "web")["status"]
    assert koord["podStatus"]["containerStatuses"][0]["containerName"] == "app"
    assert set(koord["podStatus"]["containerStatuses"][0]["resources"]) == {"cpu", "memory"}
    assert koord["conditions"][0]["type"] == "RecommendationReady" and koord["updateTime"]

    again = cli("sync", "--once", "--store", str(store), "--kubeconfig", str(plane.kubeconfig))
    assert again.returncode == 0 and "0 written" in again.stderr  # nothing changed, nothing written


def test_the_sync_loop_answers_a_new_vpa_within_seconds(
    plane: ControlPlane, store: Path, objects: client.CustomObjectsApi
) -> None:
    process = subprocess.Popen(
        [entry_point(), "sync", "--store", str(store), "--kubeconfig", str(plane.kubeconfig), "--resync", "300s"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        time.sleep(2)
        objects.create_namespaced_custom_object(*VPA[:2], "shop", VPA[2], vpa("api", "api", "koord-recommender"))
        deadline = time.monotonic() + 30
        status: dict[str, Any] = {}
        while time.monotonic() < deadline and "recommendation" not in status:
            status = get(objects, VPA, "api").get("status") or {}
            time.sleep(0.5)
        assert "recommendation" in status, "the watch did not answer within 30 s"
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_sync_without_a_cluster_is_a_clear_error(store: Path, cli: Runner, tmp_path: Path) -> None:
    missing = tmp_path / "nope.kubeconfig"
    result = cli("sync", "--once", "--store", str(store), "--kubeconfig", str(missing))
    assert result.returncode == 7 and "no Kubernetes credentials" in result.stderr


def test_the_loop_answers_both_kinds_from_the_shared_caches(
    plane: ControlPlane, store: Path, objects: client.CustomObjectsApi
) -> None:
    """The status writer reads through the same informers as the webhook: one list per kind, then watches of both
    kinds at once, so a new VPA and a new Recommendation are each answered within seconds, with no list per event."""
    syncer = StatusSync(plane.api(), ServiceState(ModelStore(str(store))), SyncSettings(resync_seconds=300))
    stop, reports = threading.Event(), list[SyncReport]()
    thread = threading.Thread(target=syncer.run, args=(stop, reports.append), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not reports and time.monotonic() < deadline:
            time.sleep(0.2)
        assert reports, "no full pass within 30 s"
        objects.create_namespaced_custom_object(*VPA[:2], "shop", VPA[2], vpa("web-late", "web", "koord-recommender"))
        objects.create_namespaced_custom_object(*REC[:2], "shop", REC[2], recommendation("api-late", "api"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            "recommendation" in (get(objects, VPA, "web-late").get("status") or {})
            and "podStatus" in (get(objects, REC, "api-late").get("status") or {})
        ):
            time.sleep(0.5)
        assert "recommendation" in (get(objects, VPA, "web-late").get("status") or {}), "the VPA was not answered"
        assert "podStatus" in (get(objects, REC, "api-late").get("status") or {}), "the Recommendation was not answered"
        assert [informer.lists for informer in syncer.informers] == [1, 1], "an event cost a list"
        written = {name for report in reports for name in report.written}
        assert {"VerticalPodAutoscaler shop/web-late", "Recommendation shop/api-late"} <= written
    finally:
        stop.set()
        thread.join(timeout=15)
    assert not thread.is_alive()


def test_a_vpa_says_when_the_live_update_it_shows_has_aged(
    plane: ControlPlane, store: Path, objects: client.CustomObjectsApi, tmp_path: Path
) -> None:
    """While `sync` serves the live loop's updates, each VPA carries RecommendationStale: False with a fresh update,
    True once the update is older than `live_stale_after_seconds` (the loop stalled), written once as it ages, and
    False again with the loop's next update."""
    shutil.copytree(store, tmp_path / "store")
    live_store = ModelStore(str(tmp_path / "store"))
    version = live_store.latest_name()
    assert version is not None
    lines = live_store.load(version).recommendations

    def publish() -> float:
        update = live_store.publish_live(lines, version=version, last_sample=lines.as_of - 1)
        return update.written_at

    written = publish()
    now = [written + 10.0]
    syncer = StatusSync(
        plane.api(), ServiceState(live_store), SyncSettings(live_stale_after_seconds=300), clock=lambda: now[0]
    )

    def stale() -> dict[str, Any]:
        conditions = get(objects, VPA, "web")["status"]["conditions"]
        found: dict[str, Any] = next(c for c in conditions if c["type"] == "RecommendationStale")
        return found

    syncer.sync_once()
    fresh = stale()
    assert (fresh["status"], fresh["reason"]) == ("False", "LiveUpdateFresh") and "+live.1" in fresh["message"]
    assert "status" not in get(objects, VPA, "api-default")  # another recommender's VPA is still left alone
    now[0] = written + 301.0  # the loop has not published for over 5 minutes
    assert "VerticalPodAutoscaler shop/web" in syncer.sync_once().written
    aged = stale()
    assert (aged["status"], aged["reason"]) == ("True", "LiveUpdateAgeing"), aged
    assert "RecommendationProvided" in {c["type"] for c in get(objects, VPA, "web")["status"]["conditions"]}
    now[0] += 120.0
    assert "VerticalPodAutoscaler shop/web" in syncer.sync_once().unchanged  # ageing further writes nothing
    now[0] = publish() + 1.0  # the loop is back
    syncer.sync_once()
    back = stale()
    assert (back["status"], back["reason"]) == ("False", "LiveUpdateFresh") and "+live.2" in back["message"]
