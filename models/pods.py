"""Pod and OOM bookkeeping of a fleet's usage: group labels, per-pod state, per-workload description, sample steps.

`WorkloadRecommender` keeps these beside its sub-estimators: `pod_states` per (group, pod) (first and last sample,
per-resource sample counts, the last requests and limits), `describe_workloads` per group (history window, pods,
current replicas, containers per pod) and the OOM kills as memory samples and counts.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from models._validation import factorize_labels
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


def pod_pairs(rows: IntArray, pods: IntArray) -> tuple[IntArray, IntArray]:
    """Each sample's (row, pod) pair as a code, in the order pairs first appear, and each pair's row: a pod's name
    may recur under other rows (`rows`, `pods`: one integer code each a sample, both >= 0)."""
    per_row = int(pods.max(initial=-1)) + 1
    codes, found = pd.factorize(rows * per_row + pods)
    owners: IntArray = np.asarray(found, dtype=np.int64) // max(per_row, 1)
    return codes.astype(np.int64), owners


def with_group_labels(usage: pd.DataFrame) -> pd.DataFrame:
    """The usage frame with a `group` column of labels, computed once per distinct key."""
    # Factorizing each column, then the combined integer code, is far cheaper than hashing string triples.
    per_column = [factorize_labels(usage[column]) for column in KEY_COLUMNS]
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
    """Per (group, pod): first and last sample, sample count, and the last requests/limits it reported (the newest
    known value; of two at one time, the later row's). Rows in the order pods first appear in time order."""
    group_codes, group_labels = factorize_labels(usage["group"])
    pod_codes, pod_labels = factorize_labels(usage["pod"])
    width = max(len(pod_labels), 1)
    pair_ids, pairs = pd.factorize(group_codes * width + pod_codes)
    n = len(pairs)
    times = usage["timestamp"].to_numpy()
    first, last = _extreme_rows(pair_ids, times, n, newest=False), _extreme_rows(pair_ids, times, n, newest=True)
    # Pods in time order of their first sample (ties: row order), as a stable sort by time meets them.
    order = np.lexsort((first, times[first]))
    columns: dict[str, Any] = {
        "first_sample": times[first[order]],
        "last_sample": times[last[order]],
        "samples": np.bincount(pair_ids, minlength=n)[order],
    }
    for name, column in SAMPLE_COLUMNS.items():
        columns[name] = np.bincount(pair_ids[usage[column].notna().to_numpy()], minlength=n)[order]
    present = [c for c in CURRENT_COLUMNS if c in usage.columns]
    for column in present:
        values = usage[column]
        known = values.notna().to_numpy()
        newest = _extreme_rows(pair_ids[known], times[known], n, newest=True)
        rows = np.full(n, -1, dtype=np.int64)
        rows[newest >= 0] = np.flatnonzero(known)[newest[newest >= 0]]
        source = values.to_numpy() if isinstance(values.dtype, np.dtype) else values.array
        columns[column] = pd.api.extensions.take(source, rows[order], allow_fill=True)
    for column in CURRENT_COLUMNS:
        columns.setdefault(column, np.full(n, np.nan))
    index = pd.MultiIndex.from_arrays(
        [group_labels.astype(str)[pairs[order] // width], pod_labels[pairs[order] % width]], names=["group", "pod"]
    )
    missing = [c for c in CURRENT_COLUMNS if c not in present]
    names = ["first_sample", "last_sample", "samples", *SAMPLE_COLUMNS, *present, *missing]
    return pd.DataFrame({name: columns[name] for name in names}, index=index)


def _extreme_rows(ids: IntArray, times: npt.NDArray[Any], n: int, newest: bool) -> IntArray:
    """Per id, the row of its oldest (or newest) time; of rows at that time the first (the last for the newest),
    where a stable sort by time puts them; -1 for an id without rows."""
    at = np.asarray(times, dtype=np.float64)
    best = np.full(n, -np.inf if newest else np.inf)
    (np.maximum if newest else np.minimum).at(best, ids, at)
    tied = at == best[ids]
    rows = np.arange(len(ids))[tied]
    found = np.full(n, -1 if newest else len(ids), dtype=np.int64)
    (np.maximum if newest else np.minimum).at(found, ids[tied], rows)
    found[found == len(ids)] = -1
    return found


def merge_pod_states(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Pod state after more samples: widest window, summed counts, the newest non-missing requests/limits; rows in
    (group, pod) order."""
    if old.index.is_monotonic_increasing and all(isinstance(t, np.dtype) for t in (*old.dtypes, *new.dtypes)):
        positions = old.index.get_indexer(new.index)
        if len(positions) == 0 or positions.min() >= 0:
            return _merge_known(old, new, positions)
    return _merge_any(old, new)


def _merge_known(old: pd.DataFrame, new: pd.DataFrame, positions: IntArray) -> pd.DataFrame:
    """`_merge_any` of new states of known pods only, into sorted ones, in numpy: the outer join is then the old
    rows, and the new ones go to their places (missing for the pods without samples now, as the join leaves them)."""
    complete = len(positions) == len(old)

    def aligned(column: str) -> npt.NDArray[Any]:
        values = new[column].to_numpy()
        if complete:
            out = np.empty_like(values)
        else:
            out = np.full(len(old), np.nan, dtype=np.result_type(values.dtype, np.float64))
        out[positions] = values
        return out

    merged: dict[str, Any] = {}
    for column, pick in (("first_sample", np.fmin), ("last_sample", np.fmax)):
        merged[column] = pick(old[column].to_numpy(), aligned(column))
    for column in ("samples", *SAMPLE_COLUMNS):
        before, now = old[column].to_numpy(), aligned(column)
        merged[column] = np.nan_to_num(before, nan=0) + np.nan_to_num(now, nan=0)
    for column in CURRENT_COLUMNS:
        before, now = old[column].to_numpy(), aligned(column)
        merged[column] = np.where(np.isnan(now), before, now) if np.isnan(now).any() else now
    return pd.DataFrame(merged, index=old.index)


def _merge_any(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """`merge_pod_states` by an outer join (new pods, or states not yet in (group, pod) order)."""
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
    """Per group (in label order): key columns, history window, pods, current replicas, samples, containers per
    pod, last requests/limits (their largest over the pods)."""
    index = pods.index
    assert isinstance(index, pd.MultiIndex)
    level = index.levels[0]
    by_label = np.asarray(level.argsort(), dtype=np.int64)
    ranks = np.empty(len(level), dtype=np.int64)
    ranks[by_label] = np.arange(len(level))
    codes = ranks[np.asarray(index.codes[0], dtype=np.int64)]
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]) if len(codes) else np.zeros(0, int)
    of_group = np.cumsum(np.r_[False, sorted_codes[1:] != sorted_codes[:-1]]) if len(codes) else np.zeros(0, int)

    def per_group(column: str, reduce: np.ufunc) -> npt.NDArray[Any]:
        values = pods[column].to_numpy()[order]
        return reduce.reduceat(values, starts) if len(values) else values

    last = pods["last_sample"].to_numpy()[order]
    newest = per_group("last_sample", np.fmax)
    columns: dict[str, Any] = {
        "first_sample": per_group("first_sample", np.fmin),
        "last_sample": newest,
        "pods": np.diff(np.r_[starts, len(codes)]).astype(np.int64),
        "samples": per_group("samples", np.add),
        **{column: per_group(column, np.add) for column in SAMPLE_COLUMNS},
        **{column: per_group(column, np.fmax) for column in CURRENT_COLUMNS},
        "replicas": np.bincount(
            of_group, weights=last >= newest[of_group] - REPLICA_WINDOW_SECONDS, minlength=len(starts)
        ).astype(np.int64),
    }
    labels = level.take(by_label[sorted_codes[starts]]).rename("group")
    keys = _workload_keys(tuple(labels))
    described = {**{column: keys[column].array for column in KEY_COLUMNS}, **{c: columns[c] for c in _DESCRIBED}}
    return pd.DataFrame({**described, "containers_per_pod": keys["containers_per_pod"].to_numpy()}, index=labels)


@functools.lru_cache(maxsize=1024)
def _workload_keys(labels: tuple[str, ...]) -> pd.DataFrame:
    """The key columns of these group labels and each one's containers per pod (a group is one container of its
    workload, so a workload's groups are its containers); kept for the next pass, whose groups are the same."""
    keys = pd.DataFrame([json.loads(label) for label in labels], columns=list(KEY_COLUMNS))
    containers = keys.groupby(["namespace", "workload"])["container"].transform("size").astype(np.int64)
    return keys.assign(containers_per_pod=containers)


#: `describe_workloads`' columns after the keys, in their order.
_DESCRIBED = [
    "first_sample", "last_sample", "pods", "samples", *SAMPLE_COLUMNS, *CURRENT_COLUMNS, "replicas",
]  # fmt: skip


def sample_steps(usage: pd.DataFrame) -> Sketch:
    """Distinct times between consecutive samples of a pod container, seconds, and their counts: their median
    is the sample interval (60 s, VPA's assumption, when there are none)."""
    pods = factorize_labels(usage["pod"])[0]
    groups = usage["group"].cat.codes.to_numpy()
    times = usage["timestamp"].to_numpy(dtype=np.float64)
    order = np.lexsort((times, pods, groups))
    same = (groups[order][1:] == groups[order][:-1]) & (pods[order][1:] == pods[order][:-1])
    steps = np.diff(times[order])[same]
    values, counts = np.unique(steps[steps > 0].astype(np.int64), return_counts=True)
    return values.astype(np.int64), counts.astype(np.int64)
