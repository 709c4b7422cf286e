"""Pod and workload state (models/pods.py) against the rules written out in plain Python, and the merge of known
pods against the general outer join."""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from models.pods import (
    CURRENT_COLUMNS,
    REPLICA_WINDOW_SECONDS,
    _merge_any,
    describe_workloads,
    merge_pod_states,
    pod_states,
    with_group_labels,
)

maybe = st.one_of(st.none(), st.floats(0, 64, allow_nan=False))
rows = st.lists(
    st.tuples(
        st.sampled_from([("ns", "web", "app"), ("ns", "web", "side"), ("ns", "db", "app"), ("o", "web", "app")]),
        st.sampled_from(["p1", "p2", "p3"]),
        st.integers(0, 40).map(lambda k: 300 * k),
        maybe,
        maybe,
        maybe,
    ),
    min_size=1,
    max_size=40,
)


def _usage(found: list[tuple[Any, ...]]) -> pd.DataFrame:
    frame = pd.DataFrame(
        [
            (t, key[0], key[1], pod, key[2], cpu, 1e9 if cpu is not None else None, request)
            for key, pod, t, cpu, _, request in found
        ],
        columns=[
            "timestamp", "namespace", "workload", "pod", "container", "cpu_cores", "memory_bytes", "cpu_request_cores",
        ],
    )  # fmt: skip
    return with_group_labels(frame.astype({"cpu_cores": float, "memory_bytes": float, "cpu_request_cores": float}))


def _by_hand(usage: pd.DataFrame) -> dict[tuple[str, str], dict[str, float]]:
    """Per pod: first/last sample, counts, and the request of its newest row that has one (the later row of two)."""
    pods: dict[tuple[str, str], dict[str, float]] = {}
    for row in usage.sort_values("timestamp", kind="stable").itertuples():
        state = pods.setdefault((str(row.group), row.pod), {"first": row.timestamp, "samples": 0, "cpu": 0})
        state["last"] = row.timestamp
        state["samples"] += 1
        state["cpu"] += not math.isnan(row.cpu_cores)
        if not math.isnan(row.cpu_request_cores):
            state["request"] = row.cpu_request_cores
    return pods


@given(rows)
@settings(max_examples=80, deadline=None)
def test_pod_states_are_the_rule_in_time_order_of_first_samples(found: list[tuple[Any, ...]]) -> None:
    usage = _usage(found)
    states = pod_states(usage)
    expected = _by_hand(usage)
    assert list(states.index) == list(expected)  # a stable time sort meets the pods in this order
    for (group, pod), state in expected.items():
        got = states.loc[(group, pod)]
        assert (got["first_sample"], got["last_sample"]) == (state["first"], state["last"])
        assert (got["samples"], got["cpu_samples"]) == (state["samples"], state["cpu"])
        request = got["cpu_request_cores"]
        assert request == state["request"] if "request" in state else math.isnan(request)
        assert all(math.isnan(got[c]) for c in CURRENT_COLUMNS if c != "cpu_request_cores")


@given(rows, rows, st.booleans())
@settings(max_examples=60, deadline=None)
def test_merging_known_pods_is_the_outer_join(
    before: list[tuple[Any, ...]], after: list[tuple[Any, ...]], fewer: bool
) -> None:
    """The numpy merge of pods already known (sorted, as after any merge) gives the join's frame, dtypes too."""
    old = _merge_any(pod_states(_usage(before)), pod_states(_usage(before[:1])))
    known = [row for row in after if (json.dumps(list(row[0])), row[1]) in set(old.index)]
    new = pod_states(_usage((known[:1] if fewer else known) or before[:1]))
    pd.testing.assert_frame_equal(merge_pod_states(old, new), _merge_any(old, new), check_exact=True)


@given(rows)
@settings(max_examples=60, deadline=None)
def test_workloads_describe_their_pods(found: list[tuple[Any, ...]]) -> None:
    usage = _usage(found)
    states = pod_states(usage)
    described = describe_workloads(states)
    groups = sorted({str(g) for g in usage["group"]})
    assert list(described.index) == groups
    for group in groups:
        mine = states.loc[group]
        row = described.loc[group]
        newest = mine["last_sample"].max()
        assert (row["first_sample"], row["last_sample"]) == (mine["first_sample"].min(), newest)
        assert (row["pods"], row["samples"]) == (len(mine), mine["samples"].sum())
        assert row["replicas"] == (mine["last_sample"] >= newest - REPLICA_WINDOW_SECONDS).sum()
        namespace, workload, container = json.loads(group)
        assert (row["namespace"], row["workload"], row["container"]) == (namespace, workload, container)
        siblings = {json.loads(g)[2] for g in groups if json.loads(g)[:2] == [namespace, workload]}
        assert row["containers_per_pod"] == len(siblings)
        requests = mine["cpu_request_cores"].dropna()
        assert row["cpu_request_cores"] == requests.max() if len(requests) else math.isnan(row["cpu_request_cores"])
