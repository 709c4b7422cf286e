"""Assembly of Prometheus answers into tidy rows: owner chains and what happens when one batch fails."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.settings import Settings
from models.store import ModelStore
from pipelines import train
from pipelines.prometheus import PrometheusClient
from pipelines.prometheus_source import PrometheusSource, _concat_rows, _per_row, plan_batches
from pipelines.settings import PrometheusSettings
from recommender.errors import PrometheusError

PODS = {"a": ["a-web-5d4f8b9c7-x1x1x"], "b": ["b-batch-1"]}


def matrix(namespace: str, column: str) -> dict[str, object]:
    result = [
        {"metric": {"namespace": namespace, "pod": pod, "container": "main"}, "values": [[600, "1.5"], [900, "2.0"]]}
        for pod in PODS[namespace]
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def handler(request: httpx.Request) -> httpx.Response:
    form = dict(parse_qs(request.content.decode()).items())
    path = request.url.path
    if path.endswith("/series"):
        match = form["match[]"][0]
        if match.startswith("container_memory_working_set_bytes"):
            data = [{"namespace": ns, "pod": pod, "container": "main"} for ns, pods in PODS.items() for pod in pods]
        elif match.startswith("kube_pod_owner"):
            data = [
                {
                    "namespace": "a",
                    "pod": PODS["a"][0],
                    "owner_kind": "ReplicaSet",
                    "owner_name": "a-web-5d4f8b9c7",
                    "owner_is_controller": "true",
                },
                {
                    "namespace": "b",
                    "pod": "b-batch-1",
                    "owner_kind": "Job",
                    "owner_name": "b-batch",
                    "owner_is_controller": "true",
                },
            ]
        elif match.startswith("kube_replicaset_owner"):
            data = [
                {"namespace": "a", "replicaset": "a-web-5d4f8b9c7", "owner_kind": "Deployment", "owner_name": "web"}
            ]
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


# -- quarantine of impossible samples (issue 13) ---------------------------------------------------------------------

STEP, START = 300, 1_699_999_800  # on the 5-minute grid, where Prometheus answers a range query
POISONED = {
    "web-1": {},
    "bad-1": {"cpu": (100, "1e300")},
    "neg-1": {"memory": (7, "-5")},
    "inf-1": {"cpu": (3, "+Inf")},
    "nan-1": {"memory": (5, "NaN")},
}


def poisoned(request: httpx.Request) -> httpx.Response:
    """A Prometheus whose answers hold one impossible sample in four of five pods (each its own workload)."""
    form = parse_qs(request.content.decode())
    if request.url.path.endswith("/series"):
        match = form["match[]"][0]
        data = (
            [{"namespace": "a", "pod": p, "container": "main"} for p in POISONED]
            if match.startswith("container_memory")
            else []
        )
        return httpx.Response(200, json={"status": "success", "data": data})
    query = form["query"][0]
    if not request.url.path.endswith("/query_range"):
        # The probe of the newest sample (`PrometheusSource.newest_step`) finds the pods at the read's end.
        result = [{"metric": {}, "value": [form["time"][0], "4"]}] if query.startswith("count(") else []
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})
    if not query.startswith(("rate(", "max_over_time(")):
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": []}})
    part = "cpu" if query.startswith("rate(") else "memory"
    result = []
    for pod, poison in POISONED.items():
        values = [[START + STEP * i, "0.5" if part == "cpu" else "1e9"] for i in range(288)]
        if part in poison:
            index, value = poison[part]
            values[index][1] = value
        result.append({"metric": {"namespace": "a", "pod": pod, "container": "main"}, "values": values})
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": result}})


def test_a_container_with_an_impossible_sample_is_quarantined_by_name_and_never_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def client(settings: PrometheusSettings) -> PrometheusClient:
        return PrometheusClient(settings, transport=httpx.MockTransport(poisoned))

    monkeypatch.setattr(train, "PrometheusClient", client)
    settings = Settings(store={"path": tmp_path}, prometheus={"url": "http://prom.test", "history_seconds": 287 * STEP})
    with caplog.at_level(logging.WARNING, logger="pipelines.ingest"):
        manifest, _ = train.train_from_prometheus(settings, as_of=START + 288 * STEP)
    assert set(manifest.quarantined) == {"a/bad-1/main", "a/neg-1/main", "a/inf-1/main", "a/nan-1/main"}
    assert manifest.quarantined["a/bad-1/main"] == (
        f"cpu_cores 1e+300 is above the ceiling of 2048 cores per container (ingest.max_cpu_cores) at {START + 100 * STEP}"
    )
    assert "negative memory_bytes -5.0" in manifest.quarantined["a/neg-1/main"]
    assert "inf is not a finite number" in manifest.quarantined["a/inf-1/main"]
    # Issue 39: a NaN was dropped silently, the rest of the container's samples used.
    assert manifest.quarantined["a/nan-1/main"] == f"memory_bytes NaN is not a finite number at {START + 5 * STEP}"
    assert manifest.row_counts["quarantined_containers"] == 4 and manifest.row_counts["usage_rows"] == 288
    published = ModelStore(tmp_path).load().recommendations.recommendations
    assert [(r.workload, r.container) for r in published] == [("web-1", "main")]
    assert "quarantined a/bad-1/main (none of its samples are used): cpu_cores 1e+300" in caplog.text


def test_when_every_sample_is_quarantined_the_error_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 39: a fleet whose every line is NaN (one broken exporter) read as "no usage samples"."""

    def all_nan(request: httpx.Request) -> httpx.Response:
        answer = poisoned(request)
        return httpx.Response(
            answer.status_code, content=answer.content.replace(b'"0.5"', b'"NaN"').replace(b'"1e9"', b'"NaN"')
        )

    monkeypatch.setattr(
        train, "PrometheusClient", lambda s: PrometheusClient(s, transport=httpx.MockTransport(all_nan))
    )
    settings = Settings(store={"path": tmp_path}, prometheus={"url": "http://prom.test", "history_seconds": 287 * STEP})
    with caplog.at_level(logging.WARNING, logger="pipelines.ingest"), pytest.raises(PrometheusError) as caught:
        train.train_from_prometheus(settings, as_of=START + 288 * STEP)
    said = str(caught.value)
    assert "no usage samples left between" in said and "all 5 container(s) with samples were quarantined" in said
    assert "(see the warnings), the first a/bad-1/main: cpu_cores 1e+300 is above the ceiling" in said
    assert (
        f"quarantined a/web-1/main (none of its samples are used): cpu_cores NaN is not a finite number at {START}"
        in (caplog.text)
    )
    assert not (tmp_path / "latest").exists()


def test_the_newest_step_is_the_reads_end_for_a_live_fleet_else_the_last_step_with_a_line() -> None:
    """A fleet still reporting: one instant count at the end. One that stopped: the last step of a range count
    with a value, whatever gaps come before it; none at all: None."""
    answers: dict[str, list[object]] = {}
    asked: list[str] = []

    def prometheus(request: httpx.Request) -> httpx.Response:
        form = parse_qs(request.content.decode())
        kind = "matrix" if request.url.path.endswith("/query_range") else "vector"
        asked.append(f"{kind} {form['query'][0]}")
        return httpx.Response(200, json={"status": "success", "data": {"resultType": kind, "result": answers[kind]}})

    settings = PrometheusSettings(url="http://prom.test", retries=0)
    with PrometheusClient(settings, transport=httpx.MockTransport(prometheus)) as client:
        source = PrometheusSource(client, settings, ["a"])
        answers = {"vector": [{"metric": {}, "value": [START + 10 * STEP, "3"]}], "matrix": []}
        assert source.newest_step(START, START + 10 * STEP) == START + 10 * STEP
        assert len(asked) == 1 and asked[0].startswith("vector count(rate(") and 'namespace=~"a"' in asked[0]
        counts = [[START + STEP * i, "2"] for i in (0, 1, 5)]
        answers = {"vector": [], "matrix": [{"metric": {}, "values": counts}]}
        assert source.newest_step(START, START + 10 * STEP) == START + 5 * STEP
        answers = {"vector": [], "matrix": []}
        assert source.newest_step(START, START + 10 * STEP) is None


# -- batch sizing by the points an answer holds (issue 17) ------------------------------------------------------------


@given(
    st.dictionaries(st.text(min_size=1, max_size=6), st.integers(1, 6000), min_size=1, max_size=40),
    st.integers(1, 11000),
    st.integers(1, 10**7),
    st.integers(1, 6000),
)
@settings(max_examples=300, deadline=None)
def test_batches_cover_every_namespace_once_within_both_budgets(
    counts: dict[str, int], steps: int, max_points: int, max_series: int
) -> None:
    batches = plan_batches(counts, steps, max_points, max_series)
    assert sorted(ns for b in batches for ns in b.namespaces) == sorted(counts)
    for batch in batches:
        assert batch.containers == sum(counts[ns] for ns in batch.namespaces)
        assert 1 <= batch.steps_per_query <= steps
        alone = len(batch.namespaces) == 1
        assert batch.containers <= max_series or alone
        # An answer holds at most max_points points, unless one step of one namespace is already more.
        assert batch.containers * batch.steps_per_query <= max_points or batch.steps_per_query == 1
        assert batch.containers * steps <= max_points or alone
    # Next fit: two neighbours never fit one budget together, so at most twice the perfect packing.
    for a, b in itertools.pairwise(batches):
        together = a.containers + b.containers
        assert together > max_series or together * steps > max_points


def test_a_fleet_of_1000_containers_x_14_days_costs_at_most_50_queries() -> None:
    counts = {f"team-{i}": 250 for i in range(4)}
    batches = plan_batches(
        counts, 14 * 288 + 1, PrometheusSettings().max_points_per_query, PrometheusSettings().max_series_per_query
    )
    # Each namespace alone, its 14 days in ranges of 1,200 steps: 4 per line, CPU and memory, and one throttling.
    per_batch = [2 * -(-(14 * 288 + 1) // b.steps_per_query) + 1 for b in batches]
    assert len(batches) == 4 and sum(per_batch) + 8 <= 50


# -- per-container facts off the containers, names per row by one take (issue 17) ------------------------------------

FLEET = {  # namespace -> pod -> (owner kind, owner name), three namespaces read by one batch
    "c": {"c-db-0": ("StatefulSet", "db"), "c-solo": ("", "")},
    "a": {
        "a-web-5d4f8b9c7-x1x1x": ("ReplicaSet", "a-web-5d4f8b9c7"),
        "a-web-5d4f8b9c7-y2y2y": ("ReplicaSet", "a-web-5d4f8b9c7"),
    },
    "b": {"b-batch-1": ("Job", "b-batch")},
}
OOM_AT = 1200


def fleet(request: httpx.Request) -> httpx.Response:
    """Usage of every pod's `main` container at steps 300..1500 (c-solo's memory missing at 600), a memory limit
    for each, an OOM kill of a-web's first pod at 1200."""
    form = parse_qs(request.content.decode())
    ok = {"status": "success"}
    if request.url.path.endswith("/series"):
        match = form["match[]"][0]
        if match.startswith("container_memory"):
            data = [{"namespace": ns, "pod": pod, "container": "main"} for ns, pods in FLEET.items() for pod in pods]
        elif match.startswith("kube_pod_owner"):
            data = [
                {"namespace": ns, "pod": pod, "owner_kind": kind, "owner_name": name, "owner_is_controller": "true"}
                for ns, pods in FLEET.items()
                for pod, (kind, name) in pods.items()
            ]
        elif match.startswith("kube_replicaset_owner"):
            data = [
                {"namespace": "a", "replicaset": "a-web-5d4f8b9c7", "owner_kind": "Deployment", "owner_name": "web"}
            ]
        elif match.startswith("kube_pod_info"):
            data = [{"namespace": "a", "pod": "a-web-5d4f8b9c7-x1x1x", "node": "n1", "priority_class": "koord-prod"}]
        else:
            data = []
        return httpx.Response(200, json={**ok, "data": data})
    query = form["query"][0]
    if not request.url.path.endswith("/query_range"):
        result = []
        if query.startswith("max by") and "kube_pod_container_resource_limits" in query:
            result = [
                {
                    "metric": {"namespace": ns, "pod": pod, "container": "main", "resource": "memory"},
                    "value": [0, "4e9"],
                }
                for ns, pods in FLEET.items()
                for pod in pods
            ]
        elif query.startswith("count("):
            result = [{"metric": {}, "value": [form["time"][0], "5"]}]
        return httpx.Response(200, json={**ok, "data": {"resultType": "vector", "result": result}})
    start, end, step = (int(form[k][0]) for k in ("start", "end", "step"))
    if query.startswith("(max by"):  # the OOM kills
        key = {"namespace": "a", "pod": "a-web-5d4f8b9c7-x1x1x", "container": "main"}
        result = [{"metric": key, "values": [[OOM_AT, "1"]]}] if start <= OOM_AT <= end else []
    elif query.startswith(("rate(", "max_over_time(")):
        memory = query.startswith("max_over_time(")
        result = [
            {
                "metric": {"namespace": ns, "pod": pod, "container": "main"},
                "values": [
                    [t, str(t / 300 + (1e9 if memory else 0))]
                    for t in range(start, end + 1, step)
                    if not (memory and pod == "c-solo" and t == 600)
                ],
            }
            for ns, pods in FLEET.items()
            for pod in pods
        ]
    else:
        result = []
    return httpx.Response(200, json={**ok, "data": {"resultType": "matrix", "result": result}})


@pytest.mark.parametrize("concurrency", [1, 2])
def test_one_batch_of_three_namespaces_comes_sorted_with_its_facts_once_per_container(concurrency: int) -> None:
    # One batch (25 points), each of its lines read in three time chunks of at most two steps.
    settings = PrometheusSettings(url="http://prom.test", retries=0, concurrency=concurrency, max_points_per_series=2)
    with PrometheusClient(settings, transport=httpx.MockTransport(fleet)) as client:
        source = PrometheusSource(client, settings)
        plan = source.plan(300, 1500, lambda _: None)
        assert [b.namespaces for b in plan.batches] == [["a", "c", "b"]]  # largest first, ties by name
        read = source.read(300, 1500, lambda _: None, plan)
    usage = read.usage
    # Sorted as a usage file is: namespace, workload, pod, container, then time; every pod five steps.
    keys = usage[["namespace", "workload", "pod", "container", "timestamp"]]
    assert keys.equals(keys.sort_values(list(keys.columns)).reset_index(drop=True))
    assert usage.groupby("pod").size().to_dict() == {pod: 5 for pods in FLEET.values() for pod in pods}
    assert usage.loc[usage["pod"] == "c-solo", "memory_bytes"].isna().tolist() == [False, True, False, False, False]
    assert (usage["cpu_cores"] == usage["timestamp"] / 300).all()
    assert (usage["memory_limit_bytes"] == 4e9).all()
    # Names per row are codes of the batch's names (categoricals of strings), not a string per row.
    assert all(isinstance(usage[c].dtype, pd.CategoricalDtype) for c in ("namespace", "pod", "container", "node"))
    assert usage["pod"].cat.categories.dtype == "str"
    assert usage.loc[usage["node"].notna(), "pod"].unique().tolist() == ["a-web-5d4f8b9c7-x1x1x"]
    assert read.workload_kinds == {
        ("a", "web"): "Deployment",
        ("b", "b-batch"): "Job",
        ("c", "db"): "StatefulSet",
        ("c", "c-solo"): "Pod",
    }
    events = read.oom_events
    assert events.to_dict("records") == [
        {
            "timestamp": OOM_AT,
            "namespace": "a",
            "workload": "web",
            "pod": "a-web-5d4f8b9c7-x1x1x",
            "container": "main",
            "memory_bytes": 4e9,
        }
    ]


@given(
    st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=1, max_size=8),
    st.lists(st.integers(0, 7), max_size=40),
)
@settings(max_examples=200, deadline=None)
def test_names_per_row_are_the_names_indexing_gave(names: list[str | None], picks: list[int]) -> None:
    """The categorical holds, row by row, the name (or the missing value) that indexing an object array gave."""
    per_container = pd.DataFrame({"name": names})["name"]
    rows = np.array([p % len(names) for p in picks], dtype=np.int64)
    before = per_container.to_numpy()[rows]
    after = pd.Series(_per_row(per_container, rows))
    assert isinstance(after.dtype, pd.CategoricalDtype) and after.cat.categories.dtype == "str"
    assert after.isna().tolist() == pd.isna(before).tolist()
    assert after.dropna().astype(object).tolist() == [name for name in before if not pd.isna(name)]


@given(st.lists(st.lists(st.one_of(st.none(), st.sampled_from("abcde")), max_size=6), min_size=1, max_size=4))
@settings(max_examples=200, deadline=None)
def test_batches_rows_concatenated_keep_their_names_as_one_categorical(batches: list[list[str | None]]) -> None:
    """Batches with different names are joined into one categorical over all of them, every row's name kept."""
    frames = [
        pd.DataFrame(
            {
                "name": _per_row(pd.Series(names, dtype=object), np.arange(len(names), dtype=np.int64)),
                "value": np.arange(len(names), dtype=np.float64),
            }
        )
        for names in batches
    ]
    joined = _concat_rows(frames)
    assert isinstance(joined["name"].dtype, pd.CategoricalDtype)
    assert joined["name"].astype(object).where(joined["name"].notna(), None).tolist() == [
        name for names in batches for name in names
    ]
    assert joined["value"].tolist() == [float(i) for names in batches for i in range(len(names))]
