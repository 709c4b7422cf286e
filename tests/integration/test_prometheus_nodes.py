"""Node lines end to end from a real Prometheus: kube_pod_info's node and priority_class labels, through training, to
the node lines served over HTTP, against the same usage read from a tidy file with a `node` column."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipelines.prometheus import PrometheusClient
from pipelines.prometheus_source import PrometheusSource
from pipelines.settings import PrometheusSettings
from tests.conftest import BUNDLED, Runner
from tests.integration.test_prometheus import PROMETHEUS_ENV
from tests.support.openmetrics import write_openmetrics
from tests.support.prometheus_server import PrometheusServer, binaries_present

pytestmark = pytest.mark.integration
DAY = 86400
#: Small and quick: rules-only candidates are enough to compare the two paths.
FAST = {
    **PROMETHEUS_ENV,
    "KOORD_RECOMMENDER_FORECAST__USE_STL": "false",
    "KOORD_RECOMMENDER_FORECAST__USE_BOOSTING": "false",
}


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, PrometheusServer]]:
    if not binaries_present():
        pytest.skip("Debian's prometheus package is missing: `make test` installs it (scripts/install-test-deps.sh)")
    workdir = tmp_path_factory.mktemp("prometheus-nodes")
    usage = pd.read_csv(BUNDLED)
    end = int(usage["timestamp"].max())
    usage = usage[(usage["timestamp"] > end - 3 * DAY) & (usage["timestamp"] % 300 == 0)]
    pods = sorted(usage["pod"].unique())[:6]
    usage = usage[usage["pod"].isin(pods)].copy()
    # Pods alternate between two nodes; the last one is a koord-batch pod, which borrows rather than reserves.
    usage["node"] = usage["pod"].map({p: f"worker-{i % 2}" for i, p in enumerate(pods)})
    usage["priority_class"] = usage["pod"].map({p: "koord-batch" if p == pods[-1] else "koord-prod" for p in pods})
    usage = usage.sort_values(["namespace", "workload", "pod", "container", "timestamp"])
    usage.to_csv(workdir / "usage.csv", index=False)
    kinds = dict.fromkeys(usage[["namespace", "workload"]].drop_duplicates().itertuples(index=False), "StatefulSet")
    write_openmetrics(usage, kinds, workdir / "metrics.om", decoys=False)
    server = PrometheusServer(workdir / "metrics.om", workdir).start()
    try:
        yield workdir / "usage.csv", int(usage["timestamp"].max()) + 1, server
    finally:
        server.stop()


def test_the_read_carries_node_and_priority_class(placed: tuple[Path, int, PrometheusServer]) -> None:
    usage_csv, as_of, server = placed
    settings = PrometheusSettings(url=server.url, cpu_rate_window_seconds=600, history_seconds=4 * DAY)
    end = (as_of - 1) // 300 * 300
    with PrometheusClient(settings) as client:
        read = PrometheusSource(client, settings).read(end - 4 * DAY, end, lambda _: None)
    expected = pd.read_csv(usage_csv).drop_duplicates("pod").set_index("pod")
    got = read.usage.drop_duplicates("pod").set_index("pod")
    assert got["node"].to_dict() == expected["node"].to_dict()
    assert got["priority_class"].to_dict() == expected["priority_class"].to_dict()


def test_prometheus_and_file_give_the_same_node_lines(
    placed: tuple[Path, int, PrometheusServer], cli: Runner, tmp_path: Path
) -> None:
    usage_csv, as_of, server = placed
    env = FAST
    from_file = cli("train", "--input", str(usage_csv), "--store", "file", "--as-of", str(as_of), env=env)
    assert from_file.returncode == 0, from_file.stderr
    from_prometheus = cli(
        "train", "--prometheus-url", server.url, "--store", "prom", "--as-of", str(as_of), "--history", "4d", env=env
    )
    assert from_prometheus.returncode == 0, from_prometheus.stderr
    shown = {}
    for store in ("file", "prom"):
        done = cli("show", "--store", store, "--format", "json", env=env)
        assert done.returncode == 0, done.stderr
        shown[store] = {n["node"]: n for n in json.loads(done.stdout)["nodes"]}
    assert set(shown["file"]) == set(shown["prom"]) == {"worker-0", "worker-1"}
    for name, node in shown["file"].items():
        other = shown["prom"][name]
        assert {p["pod"] for p in node["pods"]} == {p["pod"] for p in other["pods"]}
        assert all(
            p["priority_class"] == "koord-prod" for p in other["pods"]
        )  # the batch pod borrows: not reserved for
        for resource in ("cpu", "memory"):
            # Prometheus' rate() and max_over_time() smooth a step's value a little; the pooled lines still agree.
            np.testing.assert_allclose(other[resource]["short_term"], node[resource]["short_term"], rtol=0.25)
            assert other[resource]["long_term"] == pytest.approx(node[resource]["long_term"], rel=0.25)
            assert other[resource]["limit"] == pytest.approx(node[resource]["limit"], rel=1e-6)
