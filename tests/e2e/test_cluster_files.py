"""`recommender cluster-files` against a real kube-apiserver: it lists pods and nodes once, then a new pod and a new
node reach the files through the watch alone (the informers count their list calls); a resourceVersion the
apiserver no longer holds (410 Gone) makes it re-list; a pod that finishes leaves the pods file."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from serving.controllers.cluster_view import ClusterFiles
from tests.e2e.conftest import _binaries
from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver, its watch cache off so that watches read etcd and a compacted version is really gone
    (the cache would otherwise serve an old version from memory)."""
    control = ControlPlane(_binaries(), tmp_path_factory.mktemp("watch-plane"))
    try:
        yield control.start(apiserver_args=("--watch-cache=false",))
    finally:
        control.stop()


@pytest.fixture
def files(plane: ControlPlane, tmp_path: Path) -> Iterator[ClusterFiles]:
    watched = ClusterFiles(
        plane.api(),
        tmp_path / "pods.json",
        tmp_path / "nodes.json",
        interval_seconds=0.2,
        resync_seconds=3600,
        backoff_max_seconds=1,
    )
    stop = threading.Event()
    thread = threading.Thread(target=watched.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield watched
    finally:
        stop.set()
        thread.join(10)


def names(path: Path) -> set[str]:
    try:
        return {item["metadata"]["name"] for item in json.loads(path.read_text())["items"]}
    except (OSError, ValueError):
        return set()


def eventually(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout} s")


def compact(plane: ControlPlane) -> None:
    """Compact etcd's history up to its current revision (its JSON gateway), as the apiserver does every 5 minutes."""
    etcd = f"http://127.0.0.1:{plane.etcd_port}/v3/kv"
    revision = int(
        httpx.post(f"{etcd}/range", json={"key": base64.b64encode(b"/").decode()}, timeout=10).json()["header"][
            "revision"
        ]
    )
    assert (
        httpx.post(f"{etcd}/compaction", json={"revision": revision, "physical": True}, timeout=10).status_code == 200
    )


def pod(name: str) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]}}


def test_new_pods_and_nodes_arrive_by_watch_and_a_gone_version_relists(
    plane: ControlPlane, files: ClusterFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="serving.kube_watch")
    core = client.CoreV1Api(plane.api())
    core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})  # no controller-manager here
    core.create_namespaced_pod("default", pod("before"))
    eventually(lambda: "before" in names(files.pods_file), "the first list wrote the pod made before")
    core.create_node({"metadata": {"name": "watched-node"}})
    core.create_namespaced_pod("default", pod("after"))
    eventually(
        lambda: "watched-node" in names(files.nodes_file) and "after" in names(files.pods_file),
        "the watch wrote the new node and pod",
    )
    assert (files.pods.lists, files.nodes.lists) == (1, 1)  # no re-list: the watch carried them
    # A finished pod holds no resources: the field-selected watch reports it gone.
    core.patch_namespaced_pod_status("after", "default", {"status": {"phase": "Succeeded"}})
    eventually(lambda: "after" not in names(files.pods_file), "the finished pod left the file")
    # A resourceVersion etcd has compacted away: the next watch gets 410 Gone, and the informer re-lists.
    compact(plane)
    files.pods.resource_version = "1"
    files.pods.interrupt()
    eventually(lambda: files.pods.lists == 2, "a re-list after 410 Gone")
    assert "pods: resourceVersion 1 is gone; re-listing" in caplog.text
    core.create_namespaced_pod("default", pod("later"))
    eventually(lambda: "later" in names(files.pods_file), "the watch resumed after the re-list")
    assert files.pods.lists == 2 and files.nodes.lists == 1
