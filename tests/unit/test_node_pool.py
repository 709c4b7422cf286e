"""The node pool as array work on integer codes (issue 17): the same pooled values as the groupby form it replaced.

`reference_pool` is that groupby form (pandas over the string key columns), kept here as the oracle: the pooled sums
must be the same floats (each node's containers added in the same order), the instances the same frame.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.forecast import usage_grid
from models.nodes import RESOURCE_COLUMNS, NodeForecaster, PooledNodeUsage, group_sums
from models.placed import high_priority_rows
from models.workload import FleetForecaster
from recommender.settings import ForecastSettings
from tests.conftest import BUNDLED

FAST = ForecastSettings(selection_days=1, seasonal_days=1, history_days=1)
KEYS = ["namespace", "pod", "container", "node"]


def reference_pool(usage: pd.DataFrame, grid_end: int, n_steps: int, step_seconds: int) -> PooledNodeUsage:
    """The pool as groupbys on the key columns: per container its per-step max, summed per node with np.add.at; rows
    missing a key are of no pod container (left out first: `ngroup`'s -1 would misalign the nodes)."""
    placed = high_priority_rows(usage)
    end = int(placed["timestamp"].max())  # the newest high-priority sample on a node, as the pool's data end
    usage = placed.dropna(subset=KEYS)
    nodes = pd.Index(sorted(usage["node"].astype(str).unique()))
    codes: npt.NDArray[np.int64] = np.asarray(usage.groupby(KEYS, sort=False).ngroup(), dtype=np.int64)
    node_of = pd.Series(usage["node"].astype(str).to_numpy()).groupby(codes).first()
    instance_node = nodes.get_indexer(pd.Index(node_of.to_numpy()))
    sums, observed = {}, {}
    for resource, (column, _, _) in RESOURCE_COLUMNS.items():
        per = usage_grid(
            codes,
            usage["timestamp"].to_numpy(dtype=np.float64),
            usage[column].to_numpy(dtype=np.float64),
            len(node_of),
            grid_end,
            n_steps,
            step_seconds,
        )
        sums[resource] = np.zeros((len(nodes), n_steps))
        counted = np.zeros((len(nodes), n_steps), dtype=np.int64)
        np.add.at(sums[resource], instance_node, np.nan_to_num(per))
        np.add.at(counted, instance_node, ~np.isnan(per))
        observed[resource] = counted > 0
    ordered = usage.sort_values("timestamp", kind="stable")
    last = ordered.groupby(KEYS, sort=False).last()
    instances = pd.DataFrame(
        {
            "workload": last["workload"].astype(str),
            "priority_class": last["priority_class"].fillna("none").astype(str) if "priority_class" in last else "none",
            "last_sample": last["timestamp"].astype(np.int64),
            "first_sample": ordered.groupby(KEYS, sort=False)["timestamp"].first().astype(np.int64),
        },
        index=last.index,
    )
    missing = pd.Series(np.nan, index=last.index)
    for resource, (_, request, limit) in RESOURCE_COLUMNS.items():
        instances[f"{resource}_request"] = last.get(request, missing).fillna(last.get(limit, missing))
    return PooledNodeUsage(list(nodes), end, grid_end, sums, observed, instances, step_seconds)


def assert_same_pool(found: PooledNodeUsage | None, expected: PooledNodeUsage) -> None:
    assert found is not None
    assert found.nodes == expected.nodes
    assert (found.data_end, found.grid_end) == (expected.data_end, expected.grid_end)
    for resource in RESOURCE_COLUMNS:
        np.testing.assert_array_equal(found.sums[resource], expected.sums[resource])
        np.testing.assert_array_equal(found.observed[resource], expected.observed[resource])
    pd.testing.assert_frame_equal(found.instances, expected.instances, check_exact=True)


def model() -> NodeForecaster:
    return NodeForecaster(FleetForecaster.from_settings(FAST))


def check(usage: pd.DataFrame) -> None:
    forecaster = model()
    found = forecaster.pool(usage)
    end = int(high_priority_rows(usage)["timestamp"].max())
    grid_end = (end // forecaster.step_seconds + 1) * forecaster.step_seconds
    assert_same_pool(found, reference_pool(usage, grid_end, forecaster._steps(), forecaster.step_seconds))


@pytest.fixture(scope="module")
def google_on_nodes() -> pd.DataFrame:
    """The bundled Google 2019 sample (real usage, unaligned timestamps) placed on 7 nodes by a seeded draw per pod,
    with priority classes (some borrowing, some unknown) and requests known for some pods only, rows shuffled."""
    usage = pd.read_csv(BUNDLED, dtype=dict.fromkeys(("namespace", "workload", "pod", "container"), "str"))
    rng = np.random.default_rng(17)
    pods = usage["pod"].unique()
    node = dict(zip(pods, rng.choice([f"node-{i}" for i in range(7)], len(pods)), strict=True))
    priority = dict(zip(pods, rng.choice(["koord-prod", "koord-batch", "koord-mid", ""], len(pods)), strict=True))
    usage["node"] = usage["pod"].map(node).astype("str")
    usage["priority_class"] = usage["pod"].map(priority).replace("", None)
    usage["cpu_request_cores"] = np.where(rng.random(len(usage)) < 0.7, usage["cpu_limit_cores"] / 2, np.nan)
    usage["memory_request_bytes"] = np.where(rng.random(len(usage)) < 0.7, usage["memory_limit_bytes"] / 2, np.nan)
    return usage.sample(frac=1.0, random_state=3).reset_index(drop=True)


def test_the_pool_of_real_usage_equals_the_groupby_pool(google_on_nodes: pd.DataFrame) -> None:
    check(google_on_nodes)


def test_partitions_pooled_apart_merge_as_the_groupby_pools_do(google_on_nodes: pd.DataFrame) -> None:
    parts = [google_on_nodes[pd.factorize(google_on_nodes["pod"])[0] % 3 == i] for i in range(3)]
    forecaster = model()
    end = int(high_priority_rows(google_on_nodes)["timestamp"].max())
    grid_end = (end // forecaster.step_seconds + 1) * forecaster.step_seconds
    found = PooledNodeUsage.merge([forecaster.pool(p, end) for p in parts])
    expected = PooledNodeUsage.merge(
        [reference_pool(p, grid_end, forecaster._steps(), forecaster.step_seconds) for p in parts]
    )
    assert expected is not None
    assert_same_pool(found, expected)


def test_group_sums_add_each_groups_rows_in_order_as_add_at_does() -> None:
    rng = np.random.default_rng(0)
    rows = rng.random((300, 50)) * 1e3
    rows[rng.random(rows.shape) < 0.3] = np.nan
    group_of = rng.integers(0, 9, 300)
    sums, seen = group_sums(rows, group_of, 10)
    expected = np.zeros((10, 50))
    np.add.at(expected, group_of, np.nan_to_num(rows))
    np.testing.assert_array_equal(sums, expected)
    np.testing.assert_array_equal(seen[9], False)
    np.testing.assert_array_equal(seen[:9], [np.any(~np.isnan(rows[group_of == g]), axis=0) for g in range(9)])
    empty_sums, empty_seen = group_sums(np.zeros((0, 4)), np.zeros(0, dtype=np.int64), 2)
    assert not empty_sums.any() and not empty_seen.any()


@st.composite
def placed_frames(draw: st.DrawFn) -> pd.DataFrame:
    """Random usage rows of a few pods, containers and nodes: repeated and equal timestamps, gaps (NaN usage and
    requests), borrowing rows, pods moving between nodes, keys missing, any row order."""
    n = draw(st.integers(1, 60))
    small = st.integers(0, 3)
    key = draw(st.lists(st.tuples(small, small, small, small), min_size=n, max_size=n))
    start = 1_700_000_000
    times = draw(st.lists(st.integers(start, start + 2 * 86400), min_size=n, max_size=n))
    value = st.one_of(st.none(), st.floats(0, 64, allow_nan=False))
    cpu, memory, request, limit = (draw(st.lists(value, min_size=n, max_size=n)) for _ in range(4))
    classes = draw(st.lists(st.sampled_from([None, "koord-prod", "koord-batch", "koord-free"]), min_size=n, max_size=n))
    frame = pd.DataFrame(
        {
            "timestamp": np.asarray(times, dtype=np.int64),
            "namespace": pd.array([f"ns{k[0] % 2}" for k in key], dtype="str"),
            "workload": pd.array([f"w{k[1] % 2}" if k[2] else None for k in key], dtype="str"),
            "pod": pd.array([None if k[1] == k[2] == 3 else f"p{k[1]}" for k in key], dtype="str"),
            "container": pd.array([f"c{k[2] % 2}" for k in key], dtype="str"),
            "node": pd.array([None if k[3] == 3 and k[0] == 3 else f"n{k[3]}" for k in key], dtype="str"),
            "cpu_cores": np.asarray(cpu, dtype=np.float64),
            "memory_bytes": np.asarray(memory, dtype=np.float64),
            "cpu_request_cores": np.asarray(request, dtype=np.float64),
            "cpu_limit_cores": np.asarray(limit, dtype=np.float64),
            "memory_limit_bytes": np.asarray(limit, dtype=np.float64) * 1e9,
            "priority_class": classes,
        }
    )
    if draw(st.booleans()):
        frame = frame.drop(columns="priority_class")
    return frame


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placed_frames())
def test_the_pool_of_random_frames_equals_the_groupby_pool(usage: pd.DataFrame) -> None:
    if high_priority_rows(usage).dropna(subset=KEYS).empty:
        assert model().pool(usage) is None
    else:
        check(usage)
