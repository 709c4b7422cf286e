"""Pod and OOM bookkeeping of a fleet's usage: group labels, per-pod state, per-workload description, sample steps.

`WorkloadRecommender` keeps these beside its sub-estimators: `pod_states` per (group, pod) (first and last sample,
per-resource sample counts, the last requests and limits), `describe_workloads` per group (history window, pods,
current replicas, containers per pod) and the OOM kills as memory samples and counts.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from recommender.arrays import IntArray
from recommender.identity import KEY_COLUMNS

USAGE_COLUMNS = ("timestamp", "namespace", "workload", "pod", "container", "cpu_cores", "memory_bytes")
#: Per resource, the pod-state column counting its known samples (`min_samples` reads it).
SAMPLE_COLUMNS = {"cpu_samples": "cpu_cores", "memory_samples": "memory_bytes"}
CURRENT_COLUMNS = (
    "cpu_request_cores",
    "cpu_limit_cores",
    "memory_request_bytes",
    "memory_limit_bytes",
    "cpu_throttled_fraction",
)
#: A pod counts as a current replica when its newest sample is at most this much older than its workload's newest,
#: seconds: three 5-minute steps, so one missed scrape does not drop it and a pod replaced an hour ago is not counted.
REPLICA_WINDOW_SECONDS = 900
Sketch = tuple[IntArray, IntArray]


def group_label(namespace: str, workload: str, container: str) -> str:
    """Unambiguous string label of a workload container (names may hold any character)."""
    return json.dumps([namespace, workload, container], ensure_ascii=False)


def with_group_labels(usage: pd.DataFrame) -> pd.DataFrame:
    """The usage frame with a `group` column of labels, computed once per distinct key."""
    # Factorizing each column, then the combined integer code, is far cheaper than hashing string triples.
    per_column = [pd.factorize(usage[column]) for column in KEY_COLUMNS]
    sizes = [max(len(uniques), 1) for _, uniques in per_column]
    combined = np.zeros(len(usage), dtype=np.int64)
    for (codes, _), size in zip(per_column, sizes):
        combined = combined * size + codes
    group_codes, distinct = pd.factorize(combined)
    parts = []
    for (_, uniques), size in zip(reversed(per_column), reversed(sizes)):
        parts.append(np.asarray(uniques, dtype=object)[distinct % size])
        distinct = distinct // size
    labels = [group_label(str(ns), str(wl), str(ct)) for ct, wl, ns in zip(*parts)]
    return usage.assign(group=pd.Categorical.from_codes(group_codes, categories=pd.Index(labels, dtype=object)))


def oom_frame(oom_events: pd.DataFrame | None, usage: pd.DataFrame) -> pd.DataFrame | None:
    """OOM events as memory samples; where the memory at the kill is unknown, the pod's highest seen usage."""
    if oom_events is None or len(oom_events) == 0:
        return None
    events = with_group_labels(oom_events)
    if "memory_bytes" not in events.columns:
        events = events.assign(memory_bytes=np.nan)
    highest = usage.groupby(["group", "pod"])["memory_bytes"].max().rename("highest")
    events = events.join(highest, on=["group", "pod"])
    value = events["memory_bytes"].fillna(events["highest"])
    return events.loc[value.notna(), ["group", "pod", "timestamp"]].assign(value=value.dropna())


def oom_counts(frame: pd.DataFrame | None) -> pd.Series:
    """OOM kills per group label (only groups with at least one)."""
    if frame is None:
        return pd.Series([], dtype=np.int64)
    return frame["group"].astype(str).value_counts().astype(np.int64)


def pod_states(usage: pd.DataFrame) -> pd.DataFrame:
    """Per (group, pod): first and last sample, sample count, and the last requests/limits it reported."""
    present = [c for c in CURRENT_COLUMNS if c in usage.columns]
    # Only the columns read here are put in time order (the last requests reported are the newest), not every row's
    # every column: the copy of the whole frame was the per-sample fit's largest temporary.
    columns = ["group", "pod", "timestamp", *SAMPLE_COLUMNS.values(), *present]
    ordered = usage[columns].sort_values("timestamp", kind="stable")
    grouped = ordered.groupby([ordered["group"].astype(str), "pod"], sort=False)
    pods: pd.DataFrame = (
        grouped["timestamp"].agg(["min", "max", "size"]).set_axis(["first_sample", "last_sample", "samples"], axis=1)
    )
    pods = pods.join(grouped[list(SAMPLE_COLUMNS.values())].count().set_axis(list(SAMPLE_COLUMNS), axis=1))
    if present:
        pods = pods.join(grouped[present].last())
    for column in CURRENT_COLUMNS:
        if column not in pods.columns:
            pods[column] = np.nan
    pods.index = pods.index.set_names(["group", "pod"])
    return pods


def merge_pod_states(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Pod state after more samples: widest window, summed counts, the newest non-missing requests/limits."""
    both = old.add_suffix("_old").join(new, how="outer")
    merged = pd.DataFrame(index=both.index)
    merged["first_sample"] = both[["first_sample_old", "first_sample"]].min(axis=1)
    merged["last_sample"] = both[["last_sample_old", "last_sample"]].max(axis=1)
    for column in ("samples", *SAMPLE_COLUMNS):
        merged[column] = both[column + "_old"].fillna(0) + both[column].fillna(0)
    for column in CURRENT_COLUMNS:
        merged[column] = both[column].fillna(both[column + "_old"])
    return merged


def describe_workloads(pods: pd.DataFrame) -> pd.DataFrame:
    """Per group: key columns, history window, pods, current replicas, samples, containers per pod, last
    requests/limits."""
    newest = pods.groupby(level="group")["last_sample"].transform("max")
    current = (
        (pods["last_sample"] >= newest - REPLICA_WINDOW_SECONDS)
        .groupby(level="group", sort=True)
        .sum()
        .rename("replicas")
    )
    grouped = pods.groupby(level="group", sort=True)
    described = (
        grouped.agg(
            first_sample=("first_sample", "min"),
            last_sample=("last_sample", "max"),
            pods=("samples", "size"),
            samples=("samples", "sum"),
            **{column: (column, "sum") for column in SAMPLE_COLUMNS},
        )
        .join(grouped[list(CURRENT_COLUMNS)].max())
        .join(current)
    )
    keys = pd.DataFrame(
        [json.loads(label) for label in described.index], columns=list(KEY_COLUMNS), index=described.index
    )
    described = keys.join(described)
    containers = described.groupby(["namespace", "workload"])["container"].nunique().rename("containers_per_pod")
    return described.join(containers, on=["namespace", "workload"])


def sample_steps(usage: pd.DataFrame) -> Sketch:
    """Distinct times between consecutive samples of a pod container, seconds, and their counts: their median
    is the sample interval (60 s, VPA's assumption, when there are none)."""
    pods = pd.factorize(usage["pod"])[0]
    groups = usage["group"].cat.codes.to_numpy()
    times = usage["timestamp"].to_numpy(dtype=np.float64)
    order = np.lexsort((times, pods, groups))
    same = (groups[order][1:] == groups[order][:-1]) & (pods[order][1:] == pods[order][:-1])
    steps = np.diff(times[order])[same]
    values, counts = np.unique(steps[steps > 0].astype(np.int64), return_counts=True)
    return values.astype(np.int64), counts.astype(np.int64)
