"""VerticalPodAutoscalerCheckpoints against a real kube-apiserver with VPA's CRDs: VPA's format round-trips, the
`vpa` policy warm-starts from one as from the samples themselves, and ours are written only when asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from kubernetes import client

from models.store import ModelStore
from models.vpa import VpaRecommender
from recommender.units import vpa_cpu_quantity, vpa_memory_quantity
from serving.controllers.checkpoints import CHECKPOINT, MANAGED_BY
from tests.conftest import Runner
from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.e2e
VPA = ("autoscaling.k8s.io", "v1", "verticalpodautoscalers")
DAY = 86400
START = 1_700_006_400  # a midnight, so checkpoint times are whole seconds anyway
NS = "legacy"
VPA_POLICY = {"KOORD_RECOMMENDER_POLICY__REQUEST_POLICY": "vpa", "KOORD_RECOMMENDER_FORECAST__ENABLED": "false"}


def samples(first_day: float, days: float, cpu: float, memory: float, seed: int) -> pd.DataFrame:
    """One pod's minute samples with some spread (the `group` column as the estimator takes it)."""
    rng = np.random.default_rng(seed)
    times = np.arange(START + first_day * DAY, START + (first_day + days) * DAY, 60)
    return pd.DataFrame(
        {
            "group": '["legacy", "web", "app"]',
            "pod": "web-1",
            "timestamp": times,
            "cpu_cores": np.round(cpu * rng.uniform(0.5, 1.5, times.size), 3),
            "memory_bytes": memory * rng.uniform(0.8, 1.2, times.size),
        }
    )


def vpa_checkpoint(name: str, container: str, status: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint object as VPA's recommender writes it (no labels of ours)."""
    return {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscalerCheckpoint",
        "metadata": {"name": f"{name}-{container}", "namespace": NS},
        "spec": {"vpaObjectName": name, "containerName": container},
        "status": status,
    }


def vpa(name: str, workload: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload},
            "recommenders": [{"name": "koord-recommender"}],
            "updatePolicy": {"updateMode": "Off"},
        },
    }


@pytest.fixture(scope="module")
def custom(plane: ControlPlane) -> client.CustomObjectsApi:
    api = plane.api()
    client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
    objects = client.CustomObjectsApi(api)
    for name in ("web", "api"):
        objects.create_namespaced_custom_object(*VPA[:2], NS, VPA[2], vpa(name, name))
    return objects


def test_vpa_checkpoint_round_trips_and_warm_starts_as_the_samples(custom: client.CustomObjectsApi) -> None:
    direct = VpaRecommender().fit(samples(0, 3, 0.8, 6e8, seed=1))
    now = START + 5 * DAY  # every memory window of the samples has closed
    sent = vpa_checkpoint("roundtrip", "app", direct.checkpoint('["legacy", "web", "app"]', now))
    custom.create_namespaced_custom_object(*CHECKPOINT[:2], NS, CHECKPOINT[2], sent)
    got = custom.get_namespaced_custom_object(*CHECKPOINT[:2], NS, CHECKPOINT[2], "roundtrip-app")
    assert got["status"] == sent["status"] and got["spec"] == sent["spec"]
    assert got["status"]["version"] == "v3" and max(got["status"]["cpuHistogram"]["bucketWeights"].values()) == 10000
    warm = VpaRecommender().fit(samples(0, 0, 0, 0, seed=0))
    warm.warm_start("g", got["status"], now)
    assert warm.recommend("g", 1, now) == direct.recommend('["legacy", "web", "app"]', 1, now)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, custom: client.CustomObjectsApi) -> Path:
    """A model of the `vpa` policy trained on days 3-5; a VPA checkpoint of days 0-3 (twice the CPU) for `web`."""
    workdir = tmp_path_factory.mktemp("vpa-store")
    recent = pd.concat(
        [
            samples(3, 2, 0.4, 3e8, seed=2),
            samples(3, 2, 0.3, 2e8, seed=3).assign(group='["legacy", "api", "app"]', pod="api-1"),
        ],
        ignore_index=True,
    )
    keys = recent["group"].str.extract(r'\["(?P<namespace>[^"]+)", "(?P<workload>[^"]+)", "(?P<container>[^"]+)"\]')
    recent.drop(columns="group").join(keys).to_csv(workdir / "usage.csv", index=False)
    history = (
        VpaRecommender()
        .fit(samples(0, 3, 0.8, 6e8, seed=1))
        .checkpoint('["legacy", "web", "app"]', START + 3 * DAY + 1)
    )
    custom.create_namespaced_custom_object(*CHECKPOINT[:2], NS, CHECKPOINT[2], vpa_checkpoint("web", "app", history))
    return workdir


def test_sync_warm_starts_the_vpa_policy_from_the_cluster_checkpoint(
    plane: ControlPlane, store: Path, custom: client.CustomObjectsApi, cli: Runner
) -> None:
    trained = cli("train", "--input", str(store / "usage.csv"), "--store", str(store / "store"), env=VPA_POLICY)
    assert trained.returncode == 0, trained.stderr
    result = cli(
        "sync", "--once", "--store", str(store / "store"), "--kubeconfig", str(plane.kubeconfig), env=VPA_POLICY
    )
    assert result.returncode == 0, result.stderr
    status = custom.get_namespaced_custom_object(*VPA[:2], NS, VPA[2], "web")["status"]
    written = status["recommendation"]["containerRecommendations"][0]

    model = ModelStore(store / "store").load_model()
    learned = next(r for r in model.predict().recommendations if r.workload == "web")
    checkpoint = custom.get_namespaced_custom_object(*CHECKPOINT[:2], NS, CHECKPOINT[2], "web-app")["status"]
    warm = model.warm_started(learned, checkpoint, model.data_end_ + 1)
    assert warm.cpu is not None and warm.memory is not None and learned.cpu is not None
    for field, attribute in (("target", "target"), ("lowerBound", "lower_bound"), ("upperBound", "upper_bound")):
        assert written[field] == {
            "cpu": vpa_cpu_quantity(getattr(warm.cpu, attribute)),
            "memory": vpa_memory_quantity(getattr(warm.memory, attribute)),
        }
    assert warm.cpu.target > learned.cpu.target  # the history's busier days count, as they do for VPA
    listed = custom.list_namespaced_custom_object(*CHECKPOINT[:2], NS, CHECKPOINT[2])["items"]
    assert not [c for c in listed if (c["metadata"].get("labels") or {}).get(MANAGED_BY)]  # none of ours unless asked


def test_our_checkpoints_are_written_only_when_asked_and_never_over_anothers(
    plane: ControlPlane, store: Path, custom: client.CustomObjectsApi, cli: Runner
) -> None:
    def ours() -> list[str]:
        listed = custom.list_namespaced_custom_object(*CHECKPOINT[:2], NS, CHECKPOINT[2])["items"]
        return sorted(c["metadata"]["name"] for c in listed if (c["metadata"].get("labels") or {}).get(MANAGED_BY))

    args = ("sync", "--once", "--store", str(store / "store"), "--kubeconfig", str(plane.kubeconfig))
    result = cli(*args, "--write-vpa-checkpoints", env=VPA_POLICY)
    assert result.returncode == 0, result.stderr
    assert ours() == ["api-app"]  # web-app belongs to the VPA recommender: left alone
    written = custom.get_namespaced_custom_object(*CHECKPOINT[:2], NS, CHECKPOINT[2], "api-app")
    assert written["spec"] == {"vpaObjectName": "api", "containerName": "app"} and written["status"]["version"] == "v3"
    model = ModelStore(store / "store").load_model()
    as_of = model.data_end_ + 1
    continued = VpaRecommender().fit(samples(0, 0, 0, 0, seed=0))
    continued.warm_start("api", written["status"], as_of)
    assert continued.recommend("api", 1, as_of) == model.vpa_.recommend('["legacy", "api", "app"]', 1, as_of)
    again = cli(*args, "--write-vpa-checkpoints", env=VPA_POLICY)
    assert again.returncode == 0 and ours() == ["api-app"]  # replaced in place
