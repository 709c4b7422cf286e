"""Training on a real `distributed.LocalCluster` (worker processes on loopback): the same recommendations as the
single-process path, node lines and incremental training as in one process, a worker killed mid-run survived,
failures beyond the tolerance reported by name with the previous `latest` intact, and never a half-published
version."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import pytest
from distributed import Client, WorkerPlugin

from cli.settings import Settings
from models.store import Manifest, ModelStore
from pipelines.distributed import DaskExecutor, local_cluster
from pipelines.train import train_from_file
from recommender.errors import DistributedTrainingError, InputFileError
from tests.conftest import BUNDLED, DAY, entry_point
from tests.support.compare import assert_close, per_container
from tests.unit.test_nodes import FAST, alternating

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

#: The bundled Google slice: 4 workload containers, one per partition below, so 4 tasks per phase.
SCALE = {"partition_containers": 1, "retries": 1}


class KillOnFit(WorkerPlugin):  # type: ignore[misc]
    """Makes the worker process exit abruptly (as an OOM kill would) when it starts fitting a partition: once
    overall (a marker file remembers it) or, with `every_time`, whenever it starts partition `index`."""

    def __init__(self, marker: str, index: int, every_time: bool) -> None:
        self.marker = marker
        self.index = index
        self.every_time = every_time

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        name = key if isinstance(key, str) else str(key)
        if finish != "executing" or not name.startswith("fit-") or not name.endswith(f"-{self.index}"):
            return
        if not self.every_time:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
        os._exit(1)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    # One death per task is enough to call it failed (keeps the failure tests short). The saturation holds back
    # queues of many tasks only: a death also counts against a task queued behind the one that caused it.
    with dask.config.set({"distributed.scheduler.allowed-failures": 1, "distributed.scheduler.worker-saturation": 1.0}):
        with local_cluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster:
            with Client(cluster) as client:
                yield client


def settings(store: Path, **scale: Any) -> Settings:
    return Settings(store={"path": store}, scale={**SCALE, **scale}, forecast={})


def train_on(client: Client, settings: Settings) -> Manifest:
    """The bundled slice trained on the cluster."""
    return train_on_file(client, BUNDLED, settings)


def train_on_file(client: Client, usage: Path, settings: Settings, **options: Any) -> Manifest:
    return train_from_file(usage, settings, executor=DaskExecutor(client, settings.scale), **options)


def recommendations(store: ModelStore, version: str) -> bytes:
    return Path(store.root, "versions", version, "recommendations.json").read_bytes()


def test_the_workers_we_start_run_without_the_statistical_profiler(client: Client) -> None:
    # Its sampling of every thread's stack can deadlock a worker on CPython < 3.11.9 (gh-106883).
    enabled = client.run(lambda: dask.config.get("distributed.worker.profile.enabled"))
    assert len(enabled) == 2 and not any(enabled.values())


def test_partitions_share_the_fleet_calibration_and_the_per_container_models(tmp_path: Path, client: Client) -> None:
    """A partition is a fleet of its own for the choice among candidates (and the peak rule), so the forecast lines
    may differ from one process; everything per container (VPA's bounds, history, current resources, levels) is
    the same, and every partition's lines carry the whole fleet's calibration factor (merged sketches)."""
    single = settings(tmp_path / "single")
    distributed = settings(tmp_path / "distributed")
    expected_manifest = train_from_file(BUNDLED, single)
    got = train_on(client, distributed)
    assert got.row_counts["partitions"] == 4 and got.row_counts["failed_partitions"] == 0
    for key in ("usage_rows", "workload_containers", "pods"):
        assert got.row_counts[key] == expected_manifest.row_counts[key]
    assert got.data_window == expected_manifest.data_window
    mine = json.loads(recommendations(ModelStore(distributed.store.path), got.version))["recommendations"]
    theirs = json.loads(recommendations(ModelStore(single.store.path), expected_manifest.version))["recommendations"]
    assert len(mine) == len(theirs) == 4
    for ours, reference in zip(mine, theirs):
        assert (ours["history"], ours["current"]) == (reference["history"], reference["current"])
        for resource in ("cpu", "memory"):
            assert ours[resource]["levels"] == reference[resource]["levels"]
            assert ours[resource]["upper_bound"] >= ours[resource]["target"] >= ours[resource]["lower_bound"]
    for resource in ("cpu", "memory"):
        for line in ("short_term", "target", "long_term"):
            factors = [
                r[resource]["models"]["quality"][line]["calibration_factor"]
                for r in mine
                if line in r[resource]["models"]["quality"]
            ]
            # One factor up to the own factors' shrunk weight (n / (n + 1e9)): a relative spread, as a rounding to
            # 4 decimals splits values that straddle its boundary (1.54925 -> 1.5492 and 1.5493).
            assert not factors or max(factors) / min(factors) - 1 < 1e-4, (resource, line, factors)


def test_worker_killed_mid_run_is_survived(tmp_path: Path, client: Client) -> None:
    marker = tmp_path / "killed-once"
    client.register_plugin(KillOnFit(str(marker), index=2, every_time=False), name="kill")
    try:
        got = train_on(client, settings(tmp_path / "distributed"))
    finally:
        client.unregister_worker_plugin("kill")
    assert marker.exists(), "no worker was killed"
    assert got.row_counts["failed_partitions"] == 0
    # The rerun partition gives what an undisturbed distributed run over the same partitions gives, byte for byte.
    expected = train_on(client, settings(tmp_path / "undisturbed"))
    assert recommendations(ModelStore(tmp_path / "distributed"), got.version) == recommendations(
        ModelStore(tmp_path / "undisturbed"), expected.version
    )


def test_failures_beyond_tolerance_publish_nothing(tmp_path: Path, client: Client) -> None:
    store_path = tmp_path / "store"
    before = train_from_file(BUNDLED, settings(store_path))
    client.register_plugin(KillOnFit(str(tmp_path / "unused"), index=1, every_time=True), name="kill-always")
    # A worker's death also counts against a task queued behind the killing one on it (4 tasks on 2 workers are too
    # few for the scheduler to hold them back), so partition 1 may take another down with it (seen in CI: 2 of 4):
    # the tests hold that partition 1 fails and is named, and that what is published lacks exactly what failed.
    try:
        with pytest.raises(
            DistributedTrainingError, match=r"[123] of 4 partition\(s\) failed.*partition 1 \(google-2019/"
        ):
            train_on(client, settings(store_path))
        tolerated = train_on(client, settings(store_path, failure_tolerance_fraction=0.75))
    finally:
        client.unregister_worker_plugin("kill-always")
    store = ModelStore(store_path)
    # The failed run left no version and no leftovers; the tolerated one names the workloads it lacks.
    assert store.versions() == sorted([before.version, tolerated.version])
    assert not list((store_path / "versions").glob(".incoming-*"))
    assert store.latest_name() == tolerated.version
    failed = tolerated.row_counts["failed_partitions"]
    assert failed in (1, 2, 3) and len(tolerated.skipped) == failed
    reasons = sorted(tolerated.skipped.values())
    assert all(workload.startswith("google-2019/") for workload in tolerated.skipped)
    assert any(why.startswith("partition 1 (") for why in reasons), reasons
    assert len(store.load().recommendations.recommendations) == 4 - failed


def test_a_stopped_workers_run_leaves_nothing_after_the_next_run(tmp_path: Path, usage_csv: Path) -> None:
    """`train --workers 1` killed with -9 (driver and workers) once its partitions are on the store: the next run
    removes the whole incoming version, partition files and all (issue 13)."""
    command = [
        entry_point(),
        "train",
        "--input",
        str(BUNDLED),
        "--store",
        "store",
        "--workers",
        "1",
        "--partition-containers",
        "1",
    ]
    run = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    versions = tmp_path / "store" / "versions"
    try:
        deadline = time.monotonic() + 120
        while (
            not list(versions.glob(".incoming-*/work/part-*.parquet"))
            and run.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    assert run.returncode == -signal.SIGKILL, "the run ended before it could be stopped"
    assert list(versions.glob(".incoming-*/work/part-*.parquet"))
    after = subprocess.run(
        [entry_point(), "train", "--input", str(usage_csv), "--store", "store"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert after.returncode == 0, after.stderr
    assert "left by a run that stopped before publishing it" in after.stderr
    assert [p.name for p in versions.iterdir()] == [ModelStore(tmp_path / "store").latest_name()]


def placed(tmp_path: Path) -> Path:
    """Four workloads on two nodes (two of node a's pods peaking in turn, a batch pod beside them), four days: with
    one container a partition, the pods of node a are spread over three partitions."""
    path = tmp_path / "placed.csv"
    alternating(days=4).sort_values(["namespace", "workload", "pod", "container", "timestamp"]).to_csv(
        path, index=False
    )
    return path


def placed_settings(store: Path, **scale: Any) -> Settings:
    return Settings(store={"path": store}, scale={**SCALE, **scale}, forecast=FAST)


def published(store: Path) -> dict[str, Any]:
    loaded = ModelStore(store).load()
    result: dict[str, Any] = json.loads(loaded.recommendations.model_dump_json())
    return result


def test_node_lines_on_a_cluster_and_in_partitions_in_one_process_equal_one_fit(tmp_path: Path, client: Client) -> None:
    """The node model is fitted on the driver from the partitions' pooled per-node sums: the lines equal a fit on
    the whole fleet. The in-process executor with `partition_containers` set also chooses the forecasts as one
    fleet, so everything it publishes equals the whole fit."""
    usage = placed(tmp_path)
    whole = train_from_file(usage, Settings(store={"path": tmp_path / "whole"}, forecast=FAST))
    in_process = train_from_file(usage, placed_settings(tmp_path / "in-process"))
    on_cluster = train_on_file(client, usage, placed_settings(tmp_path / "cluster"))
    assert whole.row_counts["partitions"] == 1 and whole.partition_starts == []
    assert in_process.row_counts["partitions"] == on_cluster.row_counts["partitions"] == 4
    assert in_process.partition_starts == on_cluster.partition_starts
    assert whole.row_counts["nodes"] == in_process.row_counts["nodes"] == on_cluster.row_counts["nodes"] == 2
    expected, got = published(tmp_path / "whole"), published(tmp_path / "cluster")
    assert {n["node"] for n in got["nodes"]} == {"a", "b"}
    assert_close(got["nodes"], expected["nodes"])
    assert [per_container(r) for r in got["recommendations"]] == [per_container(r) for r in expected["recommendations"]]
    # In one process the partitions' forecasts are chosen as one fleet (a cluster chooses per partition): every
    # field equals the whole fit's, node sums within their summation order.
    assert_close(published(tmp_path / "in-process"), expected)


def test_a_fleet_trained_on_a_cluster_in_one_partition_continues_incrementally(tmp_path: Path, client: Client) -> None:
    """A fleet small enough for one partition, trained by the cluster's tasks (its model is a partition file): the
    version records its plan, and `--incremental` continues it as it continues several (issue 41: it refused,
    blaming an older release)."""
    usage = placed(tmp_path)
    one = placed_settings(tmp_path / "cluster", partition_containers=1000)
    first = train_on_file(client, usage, one, as_of=1_700_006_400 + 3 * DAY)
    assert first.row_counts["partitions"] == 1 and len(first.partition_starts) == 1
    more = train_on_file(client, usage, one, incremental=True)
    assert more.parent_version == first.version and more.partition_starts == first.partition_starts
    assert more.row_counts["usage_rows"] < first.row_counts["usage_rows"]


def test_incremental_training_on_a_cluster_continues_each_partition(tmp_path: Path, client: Client) -> None:
    """`--incremental` on a cluster: every partition of the parent's plan continues its own model with only the
    newer rows; per container and per node it comes out as one process continuing one model does."""
    usage = placed(tmp_path)
    cut = 1_700_006_400 + 3 * DAY
    cluster_settings = placed_settings(tmp_path / "cluster")
    first = train_on_file(client, usage, cluster_settings, as_of=cut)
    more = train_on_file(client, usage, cluster_settings, incremental=True)
    single = Settings(store={"path": tmp_path / "single"}, forecast=FAST)
    train_from_file(usage, single, as_of=cut)
    reference = train_from_file(usage, single, incremental=True)
    assert more.parent_version == first.version and more.partition_starts == first.partition_starts
    assert more.row_counts["usage_rows"] == reference.row_counts["usage_rows"] < first.row_counts["usage_rows"]
    assert more.data_window == reference.data_window
    expected, got = published(tmp_path / "single"), published(tmp_path / "cluster")
    assert_close(got["nodes"], expected["nodes"])
    assert [per_container(r) for r in got["recommendations"]] == [per_container(r) for r in expected["recommendations"]]
    # A second continuation reads nothing new: the same one-line refusal as in one process.
    with pytest.raises(InputFileError, match=f"has no rows after .*the end of version {more.version}"):
        train_on_file(client, usage, cluster_settings, incremental=True)
