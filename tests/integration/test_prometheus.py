"""Training from a real Prometheus (Debian's package), backfilled with promtool from a slice of the bundled real data.

The same usage is written as a tidy file and as cAdvisor + kube-state-metrics series; both paths must give the same
recommendations (within one histogram bucket), every workload kind must resolve through its owner chain, label
values with quotes, backslashes and newlines must be queried correctly, and a Prometheus that dies mid-run must
leave the last good model version untouched.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from distributed import Client

from cli.settings import Settings
from models.histogram import ExponentialBuckets
from pipelines.distributed import DaskExecutor, local_cluster
from pipelines.prometheus import PrometheusClient
from pipelines.prometheus_source import PrometheusSource
from pipelines.settings import PrometheusSettings
from pipelines.train import train_from_prometheus
from tests.conftest import BUNDLED, Runner, entry_point
from tests.support.compare import assert_close, per_container
from tests.support.openmetrics import OOMKill, write_openmetrics
from tests.support.prometheus_server import FailingProxy, PrometheusServer, binaries_present, free_port

pytestmark = pytest.mark.integration

DAY = 86400
WEIRD_NAMESPACE = 'team "a" \\ x\nline2'
WEIRD_WORKLOAD = 'svc"q\\z'
#: The backfilled data is scraped every 5 minutes, so rate() and increase() need a window of two scrapes.
PROMETHEUS_ENV = {
    "KOORD_RECOMMENDER_PROMETHEUS__CPU_RATE_WINDOW_SECONDS": "600",
    "KOORD_RECOMMENDER_PROMETHEUS__HISTORY_SECONDS": str(4 * DAY),
    "KOORD_RECOMMENDER_PROMETHEUS__RETRIES": "1",
    "KOORD_RECOMMENDER_PROMETHEUS__BACKOFF_INITIAL_SECONDS": "0.05",
    "KOORD_RECOMMENDER_PROMETHEUS__TIMEOUT_SECONDS": "20",
}


@dataclass(frozen=True)
class Cluster:
    usage_csv: Path
    oom_csv: Path
    kinds: dict[tuple[str, str], str]
    as_of: int
    server: PrometheusServer


def clone(rows: pd.DataFrame, namespace: str, workload: str, pod_names: list[str]) -> pd.DataFrame:
    pods = sorted(rows["pod"].unique())[: len(pod_names)]
    part = rows[rows["pod"].isin(pods)].copy()
    part["pod"] = part["pod"].map(dict(zip(pods, pod_names)))
    return part.assign(namespace=namespace, workload=workload)


def build_usage() -> tuple[pd.DataFrame, dict[tuple[str, str], str]]:
    """Three days of real Borg usage, re-homed so that every workload kind and some nasty names occur."""
    usage = pd.read_csv(BUNDLED)
    end = int(usage["timestamp"].max())
    usage = usage[(usage["timestamp"] > end - 3 * DAY) & (usage["timestamp"] % 300 == 0)]
    web = usage[usage["workload"] == "job-113812204462"]
    db = usage[usage["workload"] == "job-399444405700"]
    parts = [
        web.assign(workload="web"),
        db.assign(workload="db"),
        clone(db, "batch", "nightly", ["nightly-28012345-a1b2c", "nightly-28012345-d3e4f"]),
        clone(web, "infra", "node-agent", ["node-agent-x1", "node-agent-x2", "node-agent-x3"]),
        clone(db, "jobs", "migrate", ["migrate-q7w8e"]),
        clone(web, "bare", "debug-shell", ["debug-shell"]),
        clone(db, WEIRD_NAMESPACE, WEIRD_WORKLOAD, ['svc"q\\z-7c9d-k2j4h']),
    ]
    kinds = {
        ("google-2019", "web"): "Deployment",
        ("google-2019", "db"): "StatefulSet",
        ("batch", "nightly"): "CronJob",
        ("infra", "node-agent"): "DaemonSet",
        ("jobs", "migrate"): "Job",
        ("bare", "debug-shell"): "Pod",
        (WEIRD_NAMESPACE, WEIRD_WORKLOAD): "Deployment",
    }
    frame = pd.concat(parts, ignore_index=True).sort_values(["namespace", "workload", "pod", "container", "timestamp"])
    return frame, kinds


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not binaries_present():
        pytest.skip("Debian's prometheus package is missing: `make test` installs it (scripts/install-test-deps.sh)")
    workdir = tmp_path_factory.mktemp("prometheus")
    usage, kinds = build_usage()
    usage_csv = workdir / "usage.csv"
    usage.to_csv(usage_csv, index=False)
    victim = usage[usage["workload"] == "web"].iloc[len(usage[usage["workload"] == "web"]) // 2]
    kill_time = int(victim["timestamp"]) - 30
    pd.DataFrame(
        [
            {
                "timestamp": kill_time,
                "namespace": victim["namespace"],
                "workload": "web",
                "pod": victim["pod"],
                "container": "main",
                "memory_bytes": usage[usage["pod"] == victim["pod"]]["memory_limit_bytes"].iloc[-1],
            }
        ]
    ).to_csv(workdir / "oom.csv", index=False)
    write_openmetrics(
        usage, kinds, workdir / "metrics.om", oom_kills=[OOMKill(victim["namespace"], victim["pod"], "main", kill_time)]
    )
    server = PrometheusServer(workdir / "metrics.om", workdir).start()
    try:
        yield Cluster(usage_csv, workdir / "oom.csv", kinds, int(usage["timestamp"].max()) + 1, server)
    finally:
        server.stop()


def settings_for(url: str) -> PrometheusSettings:
    return PrometheusSettings(url=url, cpu_rate_window_seconds=600, history_seconds=4 * DAY)


def bucket(value: float, first: float) -> int:
    return int(ExponentialBuckets(first, 1000.0 if first < 1 else 1e12, 0.05).find(np.array([value]))[0])


def test_owner_chains_resolve_every_kind(cluster: Cluster) -> None:
    settings = settings_for(cluster.server.url)
    end = (cluster.as_of - 1) // 300 * 300
    with PrometheusClient(settings) as client:
        read = PrometheusSource(client, settings).read(end - 4 * DAY, end, lambda _: None)
        assert client.stats.queries <= 13
    assert read.workload_kinds == cluster.kinds
    assert read.skipped == {}
    assert set(read.usage["container"]) == {"main"}  # pause and pod-level series were skipped
    assert not read.usage.duplicated(["timestamp", "namespace", "pod", "container"]).any()  # twin series merged
    assert len(read.oom_events) == 1
    assert set(read.usage["node"].dropna()) <= {"node-0", "node-1", "node-2"}
    throttled = read.usage.groupby("pod")["cpu_throttled_fraction"].first()
    assert throttled.notna().all() and (throttled >= 0).all() and (throttled <= 1).all() and throttled.max() > 0


def test_a_rate_window_of_one_scrape_is_named_not_left_silent(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The fixture's counter is scraped every 5 minutes: a 300 s rate() window holds one sample, so no container gets
    a CPU line. The read says so once, naming the setting; with two scrapes in the window it says nothing."""
    end = (cluster.as_of - 1) // 300 * 300
    warned = []
    for window in (300, 600):
        settings = PrometheusSettings(url=cluster.server.url, cpu_rate_window_seconds=window, history_seconds=4 * DAY)
        caplog.clear()
        with caplog.at_level("WARNING", logger="pipelines.prometheus_source"), PrometheusClient(settings) as client:
            read = PrometheusSource(client, settings).read(end - 4 * DAY, end, lambda _: None)
        assert read.usage["memory_bytes"].notna().any()
        warned.append([r.getMessage() for r in caplog.records if "cpu_rate_window_seconds" in r.getMessage()])
        if window == 300:
            assert read.usage["cpu_cores"].isna().all()
    short, wide = warned
    containers = len(read.usage[["namespace", "pod", "container"]].drop_duplicates())
    assert len(short) == 1 and f"any of the {containers} containers" in short[0] and "[300s])" in short[0]
    assert wide == []


def trained_alike(cluster: Cluster, cli: Runner, tmp_path: Path, env: dict[str, str]) -> dict[str, Any]:
    """Train from the file and from Prometheus (with `env`); assert the same recommendations within one histogram
    bucket; return the Prometheus version's manifest."""
    as_of = str(cluster.as_of)
    from_file = cli(
        "train",
        "--input",
        str(cluster.usage_csv),
        "--oom-events",
        str(cluster.oom_csv),
        "--store",
        "file",
        "--as-of",
        as_of,
    )
    assert from_file.returncode == 0, from_file.stderr
    from_prom = cli("train", "--prometheus-url", cluster.server.url, "--store", "prom", "--as-of", as_of, env=env)
    assert from_prom.returncode == 0, from_prom.stderr
    assert "queries" in from_prom.stderr
    shown = {}
    for store in ("file", "prom"):
        result = cli("show", "--store", store, "--format", "json")
        shown[store] = {
            (r["namespace"], r["workload"], r["container"]): r for r in json.loads(result.stdout)["recommendations"]
        }
    assert shown["file"].keys() == shown["prom"].keys()
    assert (WEIRD_NAMESPACE, WEIRD_WORKLOAD, "main") in shown["prom"]
    for key, expected in shown["file"].items():
        got = shown["prom"][key]
        for resource, first in (("cpu", 0.01), ("memory", 1e7)):
            for field in ("target", "lower_bound", "upper_bound", "long_term"):
                a, b = expected[resource][field], got[resource][field]
                assert abs(bucket(a / 1.15, first) - bucket(b / 1.15, first)) <= 1, (key, resource, field, a, b)
        assert got["current"]["memory_limit_bytes"] == pytest.approx(expected["current"]["memory_limit_bytes"])
        assert got["kind"] == cluster.kinds[key[:2]] and expected["kind"] is None  # files carry no owner kinds
        assert got["history"]["oom_kills"] == expected["history"]["oom_kills"]
        assert got["history"]["samples"] == expected["history"]["samples"]
    assert sum(r["history"]["oom_kills"] for r in shown["prom"].values()) == 1
    manifest: dict[str, Any] = json.loads(
        next((tmp_path / "prom" / "versions").iterdir()).joinpath("manifest.json").read_text()
    )
    assert manifest["source"] == cluster.server.url
    assert manifest["row_counts"]["oom_events"] == 1
    return manifest


def test_prometheus_and_file_give_the_same_recommendations(cluster: Cluster, cli: Runner, tmp_path: Path) -> None:
    manifest = trained_alike(cluster, cli, tmp_path, PROMETHEUS_ENV)
    assert manifest["read_metrics"]["queries"] <= 13


def test_small_streamed_batches_give_the_file_paths_recommendations(
    cluster: Cluster, cli: Runner, tmp_path: Path
) -> None:
    """Answers cut to 1,000 points: every namespace its own batch, the 4 days of each read in two ranges or more, each
    answer decoded as it streams and dropped once its batch's rows are made; the result is the file path's."""
    env = {**PROMETHEUS_ENV, "KOORD_RECOMMENDER_PROMETHEUS__MAX_POINTS_PER_QUERY": "1000"}
    manifest = trained_alike(cluster, cli, tmp_path, env)
    namespaces = len({namespace for namespace, _ in cluster.kinds})
    # Per namespace: CPU and memory in at least two ranges each, and one throttling query; plus the 8 metadata queries.
    assert manifest["read_metrics"]["queries"] >= 8 + 5 * namespaces


def test_streamed_partitions_give_one_partitions_recommendations(cluster: Cluster, cli: Runner, tmp_path: Path) -> None:
    """`scale.partition_samples` of 1: every namespace is a partition of its own, read in a thread one ahead of the
    partition being fitted, its rows freed once fitted. The recommendations and node lines are those of one
    partition (the forecasts chosen as one fleet; node pools aligned as they merge) and, within one histogram
    bucket, the file path's; the facts are read once for all partitions, so the queries are one partition's plus
    one per usage batch and the newest-sample probe."""
    env = {**PROMETHEUS_ENV, "KOORD_RECOMMENDER_SCALE__PARTITION_SAMPLES": "1"}
    streamed = trained_alike(cluster, cli, tmp_path, env)
    namespaces = len({namespace for namespace, _ in cluster.kinds})
    assert streamed["row_counts"]["partitions"] == namespaces
    assert streamed["row_counts"]["oom_events"] == 1
    # Memory's forecasts and the node model went to the side process, forked once the reads' threads had ended.
    assert streamed["fit_metrics"]["side_peak_rss_mib"] > 0
    common = ("--prometheus-url", cluster.server.url, "--as-of", str(cluster.as_of))
    one = cli("train", *common, "--store", "one", env=PROMETHEUS_ENV)
    assert one.returncode == 0, one.stderr
    versions = {store: latest_version(tmp_path / store) for store in ("prom", "one")}
    got, expected = (json.loads((versions[s] / "recommendations.json").read_bytes()) for s in ("prom", "one"))
    assert expected["nodes"]
    assert_close(got, expected)
    manifests = {s: json.loads((versions[s] / "manifest.json").read_text()) for s in ("prom", "one")}
    assert manifests["one"]["row_counts"]["partitions"] == 1
    # One batch per namespace (3 queries each) instead of one for all, plus the probe of the newest sample.
    assert streamed["read_metrics"]["queries"] <= manifests["one"]["read_metrics"]["queries"] + 3 * namespaces + 1


def test_prometheus_killed_mid_run_keeps_the_last_good_version(cluster: Cluster, cli: Runner, tmp_path: Path) -> None:
    good = cli("train", "--input", str(cluster.usage_csv), "--store", "store")
    assert good.returncode == 0, good.stderr
    latest = (tmp_path / "store" / "latest").read_text()
    # A second Prometheus over the same data, killed as soon as the training run sends its first PromQL query.
    victim = PrometheusServer(None, tmp_path / "victim", copy_tsdb_from=cluster.server.data).start()

    def kill_on_first_query() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and victim.queries_logged() == 0:
            time.sleep(0.01)
        victim.kill()

    killer = threading.Thread(target=kill_on_first_query)
    killer.start()
    try:
        env = {**PROMETHEUS_ENV, "KOORD_RECOMMENDER_PROMETHEUS__CONCURRENCY": "1"}
        result = cli(
            "train",
            "--prometheus-url",
            victim.url,
            "--store",
            "store",
            "--as-of",
            str(cluster.as_of),
            env=env,
            timeout=120,
        )
    finally:
        killer.join(timeout=70)
        victim.stop()
    assert victim.queries_logged() >= 1  # it died after the run had started reading usage
    assert result.returncode in (5, 6), result.stderr
    assert "gave up after 2 attempts" in result.stderr and "ConnectError" in result.stderr
    assert "Traceback" not in result.stderr
    assert (tmp_path / "store" / "latest").read_text() == latest
    assert [p.name for p in (tmp_path / "store" / "versions").iterdir()] == [latest.strip()]


def test_prometheus_down_is_a_clear_error(cli: Runner, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = cli("train", "--prometheus-url", url, "--store", "store", env=PROMETHEUS_ENV)
    assert result.returncode == 5
    assert url in result.stderr and "gave up after 2 attempts" in result.stderr
    assert not (tmp_path / "store" / "latest").exists()


def test_entry_point_is_installed() -> None:
    assert Path(entry_point()).exists()


def test_incremental_training_reads_only_the_new_day(cluster: Cluster, cli: Runner, tmp_path: Path) -> None:
    day_before = str(cluster.as_of - DAY)
    first = cli(
        "train", "--prometheus-url", cluster.server.url, "--store", "inc", "--as-of", day_before, env=PROMETHEUS_ENV
    )
    assert first.returncode == 0, first.stderr
    more = cli(
        "train",
        "--prometheus-url",
        cluster.server.url,
        "--store",
        "inc",
        "--as-of",
        str(cluster.as_of),
        "--incremental",
        env=PROMETHEUS_ENV,
    )
    assert more.returncode == 0, more.stderr
    assert "continued from" in more.stderr
    full = cli(
        "train",
        "--prometheus-url",
        cluster.server.url,
        "--store",
        "full",
        "--as-of",
        str(cluster.as_of),
        env=PROMETHEUS_ENV,
    )
    assert full.returncode == 0, full.stderr
    manifests = {}
    for store in ("inc", "full"):
        latest = (tmp_path / store / "latest").read_text().strip()
        manifests[store] = json.loads((tmp_path / store / "versions" / latest / "manifest.json").read_text())
    assert manifests["inc"]["parent_version"] is not None
    # It read about one of the four days the full run read.
    assert manifests["inc"]["read_metrics"]["bytes"] < 0.6 * manifests["full"]["read_metrics"]["bytes"]
    assert manifests["inc"]["data_window"]["first_sample"] == manifests["full"]["data_window"]["first_sample"]
    shown = {
        store: {
            (r["namespace"], r["workload"]): r
            for r in json.loads(cli("show", "--store", store, "--format", "json").stdout)["recommendations"]
        }
        for store in ("inc", "full")
    }
    assert shown["inc"].keys() == shown["full"].keys()
    for key, expected in shown["full"].items():
        for resource in ("cpu", "memory"):
            for field in ("target", "upper_bound", "long_term"):
                assert shown["inc"][key][resource][field] == pytest.approx(expected[resource][field], rel=0.06), (
                    key,
                    resource,
                    field,
                )


def latest_version(store: Path) -> Path:
    return store / "versions" / (store / "latest").read_text().strip()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_distributed_read_by_namespace_gives_the_same_version(cluster: Cluster, cli: Runner, tmp_path: Path) -> None:
    """`--workers 2`: each task reads its own namespaces (every query scoped to them) and fits them; the
    per-container parts of the recommendations (kind from the owner discovery, history, current resources, risk
    levels, VPA's bounds) and the node lines are identical to one process reading everything (the forecast
    candidates are chosen per partition), and the OOM kill and the query costs are carried over."""
    env = PROMETHEUS_ENV
    common = ("--prometheus-url", cluster.server.url, "--as-of", str(cluster.as_of))
    single = cli("train", *common, "--store", "single", env=env)
    assert single.returncode == 0, single.stderr
    spread = cli("train", *common, "--store", "spread", "--workers", "2", "--partition-containers", "1", env=env)
    assert spread.returncode == 0, spread.stderr
    versions = {store: latest_version(tmp_path / store) for store in ("single", "spread")}
    spread_set, single_set = (
        json.loads((versions[s] / "recommendations.json").read_bytes()) for s in ("spread", "single")
    )
    assert single_set["nodes"]
    assert_close(spread_set["nodes"], single_set["nodes"])
    assert {(r["namespace"], r["workload"]): r["kind"] for r in spread_set["recommendations"]} == cluster.kinds
    assert [per_container(r) for r in spread_set["recommendations"]] == [
        per_container(r) for r in single_set["recommendations"]
    ]
    manifest = json.loads((versions["spread"] / "manifest.json").read_text())
    assert manifest["row_counts"]["partitions"] == 6 and manifest["row_counts"]["failed_partitions"] == 0
    assert manifest["row_counts"]["oom_events"] == 1 and manifest["read_metrics"]["queries"] > 0
    assert manifest["row_counts"]["nodes"] == len(single_set["nodes"])


def infra_usage_fails(path: str, form: dict[str, list[str]]) -> bool:
    """The usage range queries (CPU rate, working-set max) that read namespace infra."""
    query = form.get("query", [""])[0]
    return (
        path.endswith("/query_range")
        and query.startswith(("rate(", "max_over_time("))
        and re.search(r'namespace=~"(?:[^"]*\|)?infra(?:\|[^"]*)?"', query) is not None
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_allow_partial_and_the_failure_tolerance_mean_one_thing_in_one_process_and_on_a_cluster(
    cluster: Cluster, cli: Runner, tmp_path: Path
) -> None:
    """Namespace infra's usage queries fail (a front of the real Prometheus answers 503 to them). `--allow-partial`
    skips what could not be read and publishes the rest, in one process and on a cluster alike; without it, the
    partition that read infra fails, which `--failure-tolerance` may tolerate on a cluster (one of six partitions),
    and which fails a one-partition run as it always did."""
    # One namespace a batch, so that only infra's fail in one process too.
    env = {
        **PROMETHEUS_ENV,
        "KOORD_RECOMMENDER_PROMETHEUS__RETRIES": "0",
        "KOORD_RECOMMENDER_PROMETHEUS__MAX_SERIES_PER_QUERY": "1",
    }
    with FailingProxy(cluster.server.url, infra_usage_fails) as proxy:
        common = ("train", "--prometheus-url", proxy.url, "--as-of", str(cluster.as_of))
        refused = cli(*common, "--store", "refused", env=env)
        partial = cli(*common, "--store", "partial", "--allow-partial", env=env)
        settings = Settings(
            store={"path": tmp_path / "partial-spread"},
            prometheus={**settings_for(proxy.url).model_dump(), "retries": 0, "max_series_per_query": 1},
            scale={"partition_containers": 1},
        )
        with (
            local_cluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0") as dask,
            Client(dask) as client,
        ):
            executor = DaskExecutor(client, settings.scale)
            train_from_prometheus(settings, as_of=cluster.as_of, allow_partial=True, executor=executor)
            tolerant = settings.model_copy(
                update={
                    "store": settings.store.model_copy(update={"path": tmp_path / "tolerated"}),
                    "scale": settings.scale.model_copy(update={"failure_tolerance_fraction": 0.2}),
                }
            )
            train_from_prometheus(tolerant, as_of=cluster.as_of, executor=executor)
        assert proxy.failed >= 3
    assert refused.returncode != 0 and "infra/*" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "refused" / "latest").exists()
    assert partial.returncode == 0, partial.stderr
    assert "skipped" in partial.stderr and "infra/*" in partial.stderr
    manifests = {
        store: json.loads((latest_version(tmp_path / store) / "manifest.json").read_text())
        for store in ("partial", "partial-spread", "tolerated")
    }
    assert set(manifests["partial"]["skipped"]) == set(manifests["partial-spread"]["skipped"]) == {"infra/*"}
    assert manifests["partial-spread"]["row_counts"]["failed_partitions"] == 0
    assert manifests["tolerated"]["row_counts"]["failed_partitions"] == 1
    ((name, why),) = manifests["tolerated"]["skipped"].items()
    assert name == "infra/*" and why.startswith("partition ") and "PartialDataError" in why
    published = {
        store: json.loads((latest_version(tmp_path / store) / "recommendations.json").read_bytes())["recommendations"]
        for store in ("partial", "partial-spread", "tolerated")
    }
    namespaces = {ns for ns, _ in cluster.kinds} - {"infra"}
    for store, recommendations in published.items():
        assert {r["namespace"] for r in recommendations} == namespaces, store
    assert [per_container(r) for r in published["partial-spread"]] == [per_container(r) for r in published["partial"]]
