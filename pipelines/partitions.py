"""The units of training work and where their state waits between phases.

A partition is a range of whole workloads in the order of their containers' JSON labels (whole namespaces from
Prometheus), so the partitions' sorted recommendations concatenate to the fleet's sorted list. A plan is the list of
each partition's first workload (`Partition.start`): a version fitted in several partitions records it, and an
incremental run assigns every workload, new ones too, to the same range (`assign_partitions`), so each partition
continues its parent's model.

A partition's rows, its fitted model between the phases and its results live in a workspace: in memory for the
in-process executor (`MemoryWorkspace`), on the model store's incoming version for a cluster (`StoredWorkspace`, whose
URLs a worker on another machine opens). A usage file is handed to stored workspaces in two streaming passes
(`inventory`, then `split_file`), since a gzip CSV cannot be seeked: the driver's memory stays at one batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from models.placed import last_node_sample
from models.store import FileEntry, PartitionFiles, VersionWriter, recommendation_fragments
from pipelines.ingest import SampleBounds, iter_usage_batches, sorted_samples
from recommender.errors import InputFileError

if TYPE_CHECKING:  # the estimators are imported when first fitted (`pipelines.train`)
    from models.workload import WorkloadRecommender

WorkloadName = tuple[str, str]
#: The start of a plan's first partition: before every workload.
FIRST: WorkloadName = ("", "")


@dataclass(frozen=True)
class Partition:
    """Whole workloads (in workload order) read and fitted as one unit. `whole`: the whole fleet, unlisted (a run of
    one partition reads everything: no discovery, no scoped queries)."""

    index: int
    start: WorkloadName
    workloads: list[WorkloadName]
    containers: int
    whole: bool = False

    @property
    def name(self) -> str:
        if self.whole:
            return f"partition {self.index} (the whole fleet)"
        first = self.workloads[0] if self.workloads else self.start
        last = self.workloads[-1] if self.workloads else first
        span = f"{first[0]}/{first[1]}" + (f" .. {last[0]}/{last[1]}" if len(self.workloads) > 1 else "")
        unit = "namespaces" if first[1] == "*" else "workloads"
        return f"partition {self.index} ({span}, {len(self.workloads)} {unit})"

    @property
    def namespaces(self) -> list[str] | None:
        """The namespaces a Prometheus read of this partition is scoped to (None: every one)."""
        return None if self.whole else sorted({namespace for namespace, _ in self.workloads})

    def owns(self, frame: pd.DataFrame) -> pd.Series:
        """Which rows of a frame with namespace and workload columns (usage, OOM events) are this partition's."""
        if self.whole:
            return pd.Series(True, index=frame.index)
        keys = pd.MultiIndex.from_frame(frame[["namespace", "workload"]])
        mine = keys.isin(pd.MultiIndex.from_tuples(self.workloads)) if self.workloads else np.zeros(len(frame), bool)
        whole = {namespace for namespace, workload in self.workloads if workload == "*"}
        return pd.Series(mine | frame["namespace"].isin(whole).to_numpy(), index=frame.index)


def label_key(workload: WorkloadName) -> str:
    """Sort key of a workload in the order of its containers' group labels (`models.workload.group_label`, a JSON
    list): labels sharing the `["namespace", "workload", ` prefix are contiguous, so partitions cut in this order
    concatenate to the single-process order. `("ns", "*")`, a namespace, sorts before its workloads."""
    return json.dumps(list(workload), ensure_ascii=False)[:-1] + ", "


def whole_fleet() -> list[Partition]:
    return [Partition(0, FIRST, [], 0, whole=True)]


def plan_partitions(containers: dict[WorkloadName, int], partition_containers: int | None) -> list[Partition]:
    """Workloads in label order, cut greedily into partitions of at most `partition_containers` containers (a
    bigger workload alone); None: one partition of them all."""
    partitions: list[Partition] = []
    current: list[WorkloadName] = []
    size = 0
    for workload in sorted(containers, key=label_key):
        count = containers[workload]
        if current and partition_containers is not None and size + count > partition_containers:
            partitions.append(Partition(len(partitions), FIRST if not partitions else current[0], current, size))
            current, size = [], 0
        current.append(workload)
        size += count
    if current or not partitions:
        partitions.append(Partition(len(partitions), FIRST if not partitions else current[0], current, size))
    return partitions


def assign_partitions(containers: dict[WorkloadName, int], starts: list[WorkloadName]) -> list[Partition]:
    """The partitions of a recorded plan (each partition's first workload, in order): every workload in the range
    of the last start at or before it, so a workload stays in its partition from version to version. A partition
    may come out empty (none of its workloads has new samples)."""
    keys = [label_key(s) for s in starts]
    members: list[list[WorkloadName]] = [[] for _ in starts]
    for workload in sorted(containers, key=label_key):
        members[max(int(np.searchsorted(keys, label_key(workload), side="right")) - 1, 0)].append(workload)
    return [
        Partition(i, start, mine, sum(containers[w] for w in mine))
        for i, (start, mine) in enumerate(zip(starts, members, strict=True))
    ]


@dataclass(frozen=True)
class RowWindow:
    """Which rows of a usage file a run uses and how it moves them: before `as_of`, after `after` (an incremental
    run's parent's last sample), timestamps moved by `shift` seconds (`train --end-at`)."""

    as_of: int | None = None
    after: int | None = None
    shift: int = 0

    def apply(self, usage: pd.DataFrame) -> pd.DataFrame:
        keep = np.ones(len(usage), dtype=bool)
        if self.as_of is not None:
            keep &= (usage["timestamp"] < self.as_of).to_numpy()
        if self.shift:
            usage = usage.assign(timestamp=usage["timestamp"] + self.shift)
        if self.after is not None:
            keep &= (usage["timestamp"] > self.after).to_numpy()
        return usage if keep.all() else usage[keep]


def containers_of(usage: pd.DataFrame) -> dict[WorkloadName, int]:
    """Workload containers per workload of usage rows."""
    keys = usage[["namespace", "workload", "container"]].drop_duplicates()
    counts = keys.groupby(["namespace", "workload"], observed=True).size()
    return {(str(ns), str(wl)): int(n) for (ns, wl), n in zip(counts.index.tolist(), counts.tolist(), strict=True)}


@dataclass(frozen=True)
class FileInventory:
    """What the first streaming pass over a usage file found in the run's window."""

    containers: dict[WorkloadName, int]
    first_sample: int
    last_sample: int
    last_node_sample: int | None
    rows: int


def inventory(input_path: Path, window: RowWindow, bounds: SampleBounds) -> FileInventory:
    """First streaming pass: each workload's containers and the data window (the rows `window` keeps)."""
    keys: set[tuple[str, str, str]] = set()
    first, last, rows = np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0
    node_last: int | None = None
    for batch in iter_usage_batches(input_path, bounds):
        batch = window.apply(batch)
        if batch.empty:
            continue
        keys.update(batch[["namespace", "workload", "container"]].drop_duplicates().itertuples(index=False, name=None))
        first, last = min(first, int(batch["timestamp"].min())), max(last, int(batch["timestamp"].max()))
        rows += len(batch)
        placed = last_node_sample(batch)
        if placed is not None:
            node_last = placed if node_last is None else max(node_last, placed)
    if not rows:
        raise InputFileError(
            input_path, "has no usage rows" + (f" before as-of {window.as_of}" if window.as_of else "")
        )
    containers: dict[WorkloadName, int] = {}
    for namespace, workload, _ in keys:
        containers[(namespace, workload)] = containers.get((namespace, workload), 0) + 1
    return FileInventory(containers, int(first), int(last), node_last, rows)


def split_file(
    input_path: Path,
    partitions: list[Partition],
    workspaces: dict[int, StoredWorkspace],
    window: RowWindow,
    bounds: SampleBounds,
) -> None:
    """Second streaming pass: each partition's rows into its own Parquet file on the store."""
    index = pd.MultiIndex.from_tuples([w for p in partitions for w in p.workloads], names=["namespace", "workload"])
    owner = np.concatenate([np.full(len(p.workloads), p.index) for p in partitions])
    writers: dict[int, tuple[Any, pq.ParquetWriter]] = {}
    try:
        for batch in iter_usage_batches(input_path, bounds):
            batch = window.apply(batch)
            table = pa.Table.from_pandas(batch, preserve_index=False)
            target = owner[index.get_indexer(pd.MultiIndex.from_frame(batch[["namespace", "workload"]]))]
            order = np.argsort(target, kind="stable")
            cuts = np.flatnonzero(np.diff(target[order])) + 1
            for rows in np.split(order, cuts):
                if rows.size == 0:
                    continue
                part = int(target[rows[0]])
                if part not in writers:
                    handle = workspaces[part].files.open_input("wb")
                    writers[part] = (handle, pq.ParquetWriter(handle, table.schema))
                writers[part][1].write_table(table.take(pa.array(rows)))
    finally:
        for handle, writer in writers.values():
            writer.close()
            handle.close()


@dataclass(frozen=True)
class Kept:
    """A partition's results as its workspace kept them: the recommendations and model themselves (in memory), or
    the checksums of the files its task wrote to the store."""

    recommendations: Any = None
    model: WorkloadRecommender | None = None
    files: tuple[FileEntry, FileEntry] | None = None


class Workspace(Protocol):
    """Where one partition's state waits between the phases (see the module's docstring)."""

    def put_input(self, usage: pd.DataFrame) -> None: ...
    def take_input(self, source: str) -> pd.DataFrame | None: ...
    def put_fitted(self, model: WorkloadRecommender) -> None: ...
    def take_fitted(self) -> WorkloadRecommender: ...
    def put_results(self, recommendations: Any, model: WorkloadRecommender) -> Kept: ...


@dataclass
class MemoryWorkspace:
    """A partition's state in this process (the in-process executor)."""

    usage: pd.DataFrame | None = None
    fitted: WorkloadRecommender | None = field(default=None, repr=False)

    def put_input(self, usage: pd.DataFrame) -> None:
        self.usage = usage

    def take_input(self, source: str) -> pd.DataFrame | None:
        usage, self.usage = self.usage, None
        return usage

    def put_fitted(self, model: WorkloadRecommender) -> None:
        self.fitted = model

    def take_fitted(self) -> WorkloadRecommender:
        model, self.fitted = self.fitted, None
        assert model is not None, "finish before fit"
        return model

    def put_results(self, recommendations: Any, model: WorkloadRecommender) -> Kept:
        return Kept(recommendations=recommendations, model=model)


@dataclass(frozen=True)
class StoredWorkspace:
    """A partition's state in the version being written (a cluster's tasks): its rows as Parquet, its model between
    the phases, its recommendation fragment and final model."""

    files: PartitionFiles

    @classmethod
    def of(cls, writer: VersionWriter, index: int) -> StoredWorkspace:
        return cls(writer.partition(index))

    def put_input(self, usage: pd.DataFrame) -> None:
        with self.files.open_input("wb") as handle:
            pq.write_table(pa.Table.from_pandas(usage, preserve_index=False), handle)

    def take_input(self, source: str) -> pd.DataFrame | None:
        """The rows, checked and sorted as a whole file's are (None when the partition has none)."""
        try:
            with self.files.open_input("rb") as handle:
                usage: pd.DataFrame = pq.read_table(handle).to_pandas()
        except FileNotFoundError:
            return None
        return sorted_samples(usage, source)

    def put_fitted(self, model: WorkloadRecommender) -> None:
        self.files.write_fitted(model)

    def take_fitted(self) -> WorkloadRecommender:
        model: WorkloadRecommender = self.files.take_fitted()
        return model

    def put_results(self, recommendations: Any, model: WorkloadRecommender) -> Kept:
        fragment = b",".join(recommendation_fragments(recommendations.recommendations))
        return Kept(files=self.files.write_results(fragment, model))
