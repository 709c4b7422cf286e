"""`recommender sync --reclaim-ratios --usage-thresholds` against a real kube-apiserver: the node labels and annotation
Koordinator reads, written only on nodes the model learned, keeping the annotation's other keys, idempotent."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from recommender import colocation
from recommender import koordinator as k
from tests.conftest import Runner, entry_point, make_usage
from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.e2e
FAST = {"KOORD_RECOMMENDER_FORECAST__USE_STL": "false", "KOORD_RECOMMENDER_FORECAST__USE_BOOSTING": "false"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("node-store")
    usage = make_usage(workloads=2, pods=2, days=3)
    usage = usage.assign(
        namespace="farm",
        node=usage["pod"].map({"w0-p0": "learned-a", "w0-p1": "learned-a", "w1-p0": "learned-b", "w1-p1": "learned-b"}),
    )
    usage.to_csv(workdir / "usage.csv", index=False)
    done = subprocess.run(
        [entry_point(), "train", "--input", str(workdir / "usage.csv"), "--store", str(workdir / "store")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **FAST},
    )
    assert done.returncode == 0, done.stderr
    return workdir / "store"


@pytest.fixture(scope="module")
def core(plane: ControlPlane) -> client.CoreV1Api:
    api = client.CoreV1Api(plane.api())
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    for name, node_annotations in (
        ("learned-a", {k.USAGE_THRESHOLDS_ANNOTATION: '{"prodUsageThresholds":{"cpu":50}}'}),
        ("learned-b", {}),
        ("stranger", {}),
    ):
        api.create_node({"metadata": {"name": name, "annotations": node_annotations}})
        api.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity}})
    return api


def test_sync_writes_reclaim_ratios_and_usage_thresholds_on_learned_nodes(
    plane: ControlPlane, store: Path, core: client.CoreV1Api, cli: Runner
) -> None:
    args = (
        "sync",
        "--once",
        "--store",
        str(store),
        "--kubeconfig",
        str(plane.kubeconfig),
        "--reclaim-ratios",
        "--usage-thresholds",
    )
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    for name in ("learned-a", "learned-b"):
        meta = core.read_node(name).metadata
        for resource in ("cpu", "memory"):
            # written as text Koordinator's truncating parser reads as the intended whole percent
            label = meta.labels[colocation.NODE_RECLAIM_LABEL[resource]]
            percent = colocation.koordinator_reclaim_percent(label)
            assert percent is not None and 0 < percent <= 100 and label == colocation.reclaim_ratio_label(percent)
        thresholds = json.loads(meta.annotations[k.USAGE_THRESHOLDS_ANNOTATION])
        assert 30 <= thresholds["usageThresholds"]["cpu"] <= 65 and 30 <= thresholds["usageThresholds"]["memory"] <= 95
        # the record of what we wrote: the extender and the next pass go back to the operator's (here the default)
        record = json.loads(meta.annotations[k.WRITTEN_THRESHOLDS_ANNOTATION])
        assert record == {"written": thresholds["usageThresholds"], "operator": {}}
    kept = json.loads(core.read_node("learned-a").metadata.annotations[k.USAGE_THRESHOLDS_ANNOTATION])
    assert kept["prodUsageThresholds"] == {"cpu": 50}
    stranger = core.read_node("stranger").metadata
    assert colocation.NODE_RECLAIM_LABEL["cpu"] not in (stranger.labels or {})
    assert k.USAGE_THRESHOLDS_ANNOTATION not in (stranger.annotations or {})

    again = cli(*args)
    assert again.returncode == 0 and "0 written" in again.stderr  # nothing changed, nothing written


def test_sync_leaves_nodes_alone_unless_asked(
    plane: ControlPlane, store: Path, core: client.CoreV1Api, cli: Runner
) -> None:
    core.patch_node("learned-b", {"metadata": {"labels": {colocation.NODE_RECLAIM_LABEL["cpu"]: "0.11"}}})
    result = cli("sync", "--once", "--store", str(store), "--kubeconfig", str(plane.kubeconfig))
    assert result.returncode == 0, result.stderr
    assert core.read_node("learned-b").metadata.labels[colocation.NODE_RECLAIM_LABEL["cpu"]] == "0.11"
