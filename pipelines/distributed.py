"""Training on a Dask cluster: the fleet in partitions of whole workloads, each read and fitted by one task, so no
process holds the fleet's raw samples; one model-store version, published only when enough partitions succeeded.

The driver (the process running `recommender train --dask-scheduler ADDRESS` or `--workers N`):
1. splits the usage file: one streaming pass lists the workloads (their containers, the newest sample), which are
   cut into partitions of about `scale.partition_containers` containers, contiguous in workload order; a second
   streaming pass writes each partition's rows as Parquet into the incoming version on the store (which the
   workers share). Two passes because a gzip CSV cannot be seeked or filtered: reading it through twice keeps the
   driver's memory at one batch, where a filtered read per task would make every task decompress the whole file.
   From Prometheus (`train_distributed_prometheus`), the driver only discovers the containers per namespace; the
   partitions are whole namespaces, and a phase-0 task per partition reads them (every query, metadata too, scoped
   to its namespaces) and writes the rows to the store.
2. phase 1, one task per partition: read its Parquet, fit `WorkloadRecommender` (forecast grids ending at the
   fleet's newest sample), write the fitted model to the store, and return `FleetStatistics` (a few kB).
3. merges the statistics into the fleet's calibration sketches and sample interval (`reduce_fleet`: the seam where
   fleet-level and node-level steps run on the gathered results).
4. phase 2, one task per partition: load its model, calibrate it with the fleet's quantities, write the final
   model and the partition's recommendations to the store, and return their checksums and selection choices.
5. streams the partitions' recommendations, in workload order, into one `recommendations.json`, and commits.

What matches the single-process fit exactly: everything per container (VPA histograms, Koordinator's mid rule, the
seasonal max), the sample interval (merged step counts) and the fleet calibration factor (merged log-bin sketches;
both paths read the same sketch). What does not: the choice among forecast candidates and the peak rule are made by
each partition for its own containers (a partition of `partition_containers` is a fleet of its own; merging the
choice would need a second pass over every partition).

A partition that fails after `scale.retries` (or whose worker died more often than Dask allows) is reported by the
names of its workloads; within `scale.failure_tolerance_fraction` the rest is published with them in the manifest's
`skipped`, beyond it nothing is published. Either way nothing half-written becomes `latest`.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from distributed import Client, Future, LocalCluster

from models.store import DataWindow, FileEntry, Manifest, ModelStore, PartitionFiles, VersionWriter
from models.workload import FleetStatistics, WorkloadRecommender, summarize_selection
from pipelines.ingest import SampleBounds, iter_usage_batches, read_oom_events
from pipelines.prometheus import PrometheusClient
from pipelines.prometheus_source import PrometheusSource
from pipelines.settings import ScaleSettings, TrainingSettings
from pipelines.train import prometheus_window, tidy_prometheus_usage
from recommender.errors import ConfigurationError, DistributedTrainingError, InputFileError, PartialDataError
from recommender.progress import Step, quiet
from recommender.resources import RecommendationSet
from recommender.text import printable

log = logging.getLogger(__name__)
WorkloadName = tuple[str, str]


@contextmanager
def dask_client(scale: ScaleSettings) -> Iterator[Client]:
    """A client of the scheduler at `scale.scheduler_address`, or of a local cluster of `scale.workers` processes
    on loopback (closed on exit)."""
    if scale.scheduler_address:
        with Client(scale.scheduler_address, timeout="30s") as client:
            yield client
        return
    if scale.workers < 1:
        raise ConfigurationError("distributed training needs a scheduler address or at least one local worker")
    with (
        LocalCluster(
            n_workers=scale.workers,
            threads_per_worker=scale.threads_per_worker,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@dataclass(frozen=True)
class Partition:
    """Whole workloads (in workload order) read and fitted by one task."""

    index: int
    workloads: list[WorkloadName]
    containers: int

    @property
    def name(self) -> str:
        first, last = self.workloads[0], self.workloads[-1]
        span = f"{first[0]}/{first[1]}" + (f" .. {last[0]}/{last[1]}" if len(self.workloads) > 1 else "")
        unit = "namespaces" if first[1] == "*" else "workloads"
        return f"partition {self.index} ({span}, {len(self.workloads)} {unit})"


def _label_prefix(workload: WorkloadName) -> str:
    """Sort key of a workload in the order of its containers' group labels (`models.workload.group_label`, a JSON
    list): labels sharing the `["namespace", "workload", ` prefix are contiguous, so partitions cut in this order
    concatenate to the single-process order."""
    return json.dumps(list(workload), ensure_ascii=False)[:-1] + ", "


def plan_partitions(containers: dict[WorkloadName, int], partition_containers: int) -> list[Partition]:
    """Workloads in label order, cut greedily into partitions of at most `partition_containers` containers (a
    bigger workload alone)."""
    partitions: list[Partition] = []
    current: list[WorkloadName] = []
    size = 0
    for workload in sorted(containers, key=_label_prefix):
        count = containers[workload]
        if current and size + count > partition_containers:
            partitions.append(Partition(len(partitions), current, size))
            current, size = [], 0
        current.append(workload)
        size += count
    if current:
        partitions.append(Partition(len(partitions), current, size))
    return partitions


@dataclass(frozen=True)
class FileInventory:
    containers: dict[WorkloadName, int]
    first_sample: int
    last_sample: int
    rows: int
    placed: bool = False


def inventory(input_path: Path, as_of: int | None, bounds: SampleBounds) -> FileInventory:
    """First streaming pass: each workload's containers and the data window (rows before `as_of`)."""
    keys: set[tuple[str, str, str]] = set()
    first, last, rows = np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0
    placed = False
    for batch in iter_usage_batches(input_path, bounds):
        if as_of is not None:
            batch = batch[batch["timestamp"] < as_of]
        if batch.empty:
            continue
        keys.update(batch[["namespace", "workload", "container"]].drop_duplicates().itertuples(index=False, name=None))
        first, last = min(first, int(batch["timestamp"].min())), max(last, int(batch["timestamp"].max()))
        rows += len(batch)
        placed = placed or ("node" in batch.columns and bool(batch["node"].notna().any()))
    if not rows:
        raise InputFileError(input_path, "has no usage rows" + (f" before as-of {as_of}" if as_of is not None else ""))
    containers: dict[WorkloadName, int] = {}
    for namespace, workload, _ in keys:
        containers[(namespace, workload)] = containers.get((namespace, workload), 0) + 1
    return FileInventory(containers, int(first), int(last), rows, placed)


def split_file(
    input_path: Path, partitions: list[Partition], version: VersionWriter, as_of: int | None, bounds: SampleBounds
) -> None:
    """Second streaming pass: each partition's rows into its own Parquet file on the store."""
    index = pd.MultiIndex.from_tuples([w for p in partitions for w in p.workloads], names=["namespace", "workload"])
    owner = np.concatenate([np.full(len(p.workloads), p.index) for p in partitions])
    writers: dict[int, tuple[Any, pq.ParquetWriter]] = {}
    try:
        for batch in iter_usage_batches(input_path, bounds):
            if as_of is not None:
                batch = batch[batch["timestamp"] < as_of]
            table = pa.Table.from_pandas(batch, preserve_index=False)
            target = owner[index.get_indexer(pd.MultiIndex.from_frame(batch[["namespace", "workload"]]))]
            order = np.argsort(target, kind="stable")
            cuts = np.flatnonzero(np.diff(target[order])) + 1
            for rows in np.split(order, cuts):
                if rows.size == 0:
                    continue
                part = int(target[rows[0]])
                if part not in writers:
                    handle = version.partition(part).open_input("wb")
                    writers[part] = (handle, pq.ParquetWriter(handle, table.schema))
                writers[part][1].write_table(table.take(pa.array(rows)))
    finally:
        for handle, writer in writers.values():
            writer.close()
            handle.close()


def _read_partition(files: PartitionFiles, source: str) -> pd.DataFrame:
    """A partition's rows, sorted as `read_usage` sorts them, refusing duplicate samples as it does."""
    with files.open_input("rb") as handle:
        usage: pd.DataFrame = pq.read_table(handle).to_pandas()
    key = ["namespace", "workload", "pod", "container", "timestamp"]
    duplicated = usage.duplicated(subset=key).to_numpy()
    if duplicated.any():
        sample = usage.iloc[int(np.argmax(duplicated))]
        raise InputFileError(source, "duplicate sample (" + ", ".join(f"{k}={sample[k]}" for k in key) + ")")
    return usage.sort_values(key, kind="stable").reset_index(drop=True)


def _peak_rss_mib() -> float:
    """This process's peak resident memory, MiB: Linux's VmHWM (of this program, where ru_maxrss would carry over
    the parent's peak into a forked or spawned worker), else ru_maxrss (kB)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), None)
    return int(line.split()[1]) / 1024 if line else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True)
class PartitionFit:
    index: int
    statistics: FleetStatistics
    usage_rows: int
    pod_names: list[str]
    first_sample: int
    last_sample: int
    fit_seconds: float


@dataclass(frozen=True)
class PartitionResult:
    index: int
    containers: int
    recommendations: dict[str, Any]
    model: dict[str, Any]
    choices: dict[str, tuple[list[str], Any, Any]]
    as_of: int
    step_seconds: int


def fit_partition(
    partition: Partition,
    files: PartitionFiles,
    settings: TrainingSettings,
    data_end: int,
    oom_events: pd.DataFrame | None,
    source: str,
) -> PartitionFit:
    """Phase 1 (a task): fit a partition and keep the fitted model on the store; return its fleet statistics."""
    started = time.perf_counter()
    usage = _read_partition(files, source)
    model = WorkloadRecommender.from_settings(settings).fit(usage, oom_events=oom_events, data_end=data_end)
    files.write_fitted(model)
    return PartitionFit(
        index=partition.index,
        statistics=model.fleet_statistics(),
        usage_rows=len(usage),
        pod_names=sorted(usage["pod"].unique().tolist()),
        first_sample=int(usage["timestamp"].min()),
        last_sample=int(usage["timestamp"].max()),
        fit_seconds=time.perf_counter() - started,
    )


def finish_partition(
    partition: Partition, files: PartitionFiles, fleet: FleetStatistics, as_of: int | None, horizon_seconds: int
) -> PartitionResult:
    """Phase 2 (a task): calibrate a partition's model with the fleet, predict, and write the model and the
    recommendations (as a fragment of the fleet's JSON) to the store."""
    model = files.take_fitted().calibrate_with_fleet(fleet)
    recommendations = model.predict(as_of=as_of, horizon_seconds=horizon_seconds)
    fragment = b",".join(r.model_dump_json().encode() for r in recommendations.recommendations)
    written, model_entry = files.write_results(fragment, model)
    return PartitionResult(
        index=partition.index,
        containers=len(recommendations.recommendations),
        recommendations=written.model_dump(),
        model=model_entry.model_dump(),
        choices=model.selection_choices(),
        as_of=recommendations.as_of,
        step_seconds=recommendations.step_seconds,
    )


def reduce_fleet(fleet: FleetStatistics, fit: PartitionFit) -> FleetStatistics:
    """The driver's step between the phases, folded over the partitions as their results arrive: the fleet-level
    quantities so far with one more partition's. Steps that need the whole fleet's (or a node's) gathered results
    run here. Folding keeps one merged sketch per line on the driver, not one per partition."""
    return FleetStatistics.merge([fleet, fit.statistics])


def _outcomes(
    futures: dict[int, Future[Any]],
    partitions: list[Partition],
    failed: dict[str, str],
    deadline: float,
    keep: Callable[[Any], Any] = lambda result: result,
) -> dict[int, Any]:
    """Results of the tasks (what `keep` makes of each), fetched as they come (a result held by a worker that then
    dies is recomputed and waited for); failures recorded by partition name with the last error. Past the deadline,
    the unfinished ones fail."""
    done: dict[int, Any] = {}
    for index, future in futures.items():
        name = partitions[index].name
        try:
            done[index] = keep(future.result(timeout=max(deadline - time.monotonic(), 0.001)))
            # Released at once: a result left on a worker that later dies would be recomputed, for nothing.
            future.release()
        except TimeoutError:
            failed[name] = "not finished within the run's timeout (scale.timeout_seconds)"
            future.cancel()
        except Exception as error:
            failed[name] = f"{type(error).__name__}: {error}"
        if name in failed:
            log.warning("%s failed: %s", printable(name), printable(failed[name]))
    return done


def _check_tolerance(failed: dict[str, str], partitions: int, scale: ScaleSettings) -> None:
    if len(failed) > scale.failure_tolerance_fraction * partitions:
        raise DistributedTrainingError(failed, partitions, scale.failure_tolerance_fraction)


@dataclass(frozen=True)
class _Job:
    """One distributed run's fixed inputs."""

    client: Client
    store: ModelStore
    version: VersionWriter
    settings: TrainingSettings
    partitions: list[Partition]
    source: str
    as_of: int | None
    horizon_seconds: int
    deadline: float

    def submit(self, phase: str, function: Callable[..., Any], index: int, *args: Any) -> Future[Any]:
        partition = self.partitions[index]
        return self.client.submit(
            function,
            partition,
            self.version.partition(index),
            *args,
            retries=self.settings.scale.retries,
            pure=False,
            key=f"{phase}-{self.version.name}-{index}",
        )


def train_distributed(
    client: Client,
    input_path: Path,
    settings: TrainingSettings,
    *,
    as_of: int | None = None,
    oom_events_path: Path | None = None,
    horizon_seconds: int = 86400,
    step: Step = quiet,
) -> Manifest:
    """Fit a usage file on the cluster behind `client` and publish one version (see the module's docstring)."""
    store = ModelStore(settings.store.path, settings.store.retention_versions)
    step(f"listing workloads in {input_path}")
    bounds = SampleBounds.at(settings.ingest, time.time())
    found = inventory(input_path, as_of, bounds)
    if found.placed:
        # The pooled node grids would need a cross-partition sum; until then, say what this run leaves out.
        log.warning(
            "%s says where pods ran, but distributed runs learn no node lines: train single-process for them",
            input_path,
        )
    partitions = plan_partitions(found.containers, settings.scale.partition_containers)
    oom = read_oom_events(oom_events_path, bounds) if oom_events_path is not None else None
    with store.writer() as version:
        job = _Job(
            client,
            store,
            version,
            settings,
            partitions,
            str(input_path),
            as_of,
            horizon_seconds,
            time.monotonic() + settings.scale.timeout_seconds,
        )
        step(f"splitting {found.rows:,} rows into {len(partitions)} partitions on {store}")
        split_file(input_path, partitions, version, as_of, bounds)
        return _fit_and_publish(job, [p.index for p in partitions], found.last_sample, oom, {}, None, step)


@dataclass(frozen=True)
class PartitionRead:
    index: int
    last_sample: int
    oom_events: pd.DataFrame
    costs: dict[str, float]
    quarantined: dict[str, str]


def read_prometheus_partition(
    partition: Partition, files: PartitionFiles, settings: TrainingSettings, start: int, end: int
) -> PartitionRead:
    """Phase 0 for Prometheus (a task): read a partition's namespaces (every query scoped to them) and write its
    rows to the store; a namespace batch that fails after the client's retries fails the task."""
    prom = settings.prometheus
    with PrometheusClient(prom) as client:
        read = PrometheusSource(client, prom, [namespace for namespace, _ in partition.workloads]).read(
            start, end, quiet
        )
        costs = client.stats.summary()
    if read.skipped:
        raise PartialDataError(read.skipped)
    usage, quarantined = tidy_prometheus_usage(
        read.usage, settings, start, end, SampleBounds.at(settings.ingest, time.time())
    )
    with files.open_input("wb") as handle:
        pq.write_table(pa.Table.from_pandas(usage, preserve_index=False), handle)
    return PartitionRead(partition.index, int(usage["timestamp"].max()), read.oom_events, costs, quarantined)


def train_distributed_prometheus(
    client: Client,
    settings: TrainingSettings,
    *,
    as_of: int | None = None,
    horizon_seconds: int = 86400,
    step: Step = quiet,
) -> Manifest:
    """Read Prometheus in partitions of whole namespaces (one task each, no process holding the fleet's samples),
    then fit and publish as for a file. A partition that cannot be read counts against the failure tolerance."""
    prom = settings.prometheus
    store = ModelStore(settings.store.path, settings.store.retention_versions)
    start, end = prometheus_window(settings, as_of)
    log.warning("distributed runs learn no node lines and no workload kinds yet: train single-process for them")
    step(f"discovering containers in {prom.url}")
    with PrometheusClient(prom) as prometheus:
        counts = PrometheusSource(prometheus, prom).containers_per_namespace(start, end)
    # Whole namespaces: a partition is named `ns/*` as a skipped Prometheus batch is, and sorts as its workloads do.
    partitions = plan_partitions(
        {(namespace, "*"): n for namespace, n in counts.items()}, settings.scale.partition_containers
    )
    with store.writer() as version:
        job = _Job(
            client,
            store,
            version,
            settings,
            partitions,
            str(prom.url),
            as_of,
            horizon_seconds,
            time.monotonic() + settings.scale.timeout_seconds,
        )
        step(f"reading {sum(counts.values())} containers in {len(partitions)} partitions")
        failed: dict[str, str] = {}
        futures = {
            p.index: job.submit("read", read_prometheus_partition, p.index, settings, start, end) for p in partitions
        }
        reads: dict[int, PartitionRead] = _outcomes(futures, partitions, failed, job.deadline)
        _check_tolerance(failed, len(partitions), settings.scale)
        if not reads:
            raise DistributedTrainingError(failed, len(partitions), settings.scale.failure_tolerance_fraction)
        oom = pd.concat([r.oom_events for r in reads.values()], ignore_index=True)
        costs = {
            key: float(sum(r.costs.get(key, 0.0) for r in reads.values())) for key in next(iter(reads.values())).costs
        }
        data_end = max(r.last_sample for r in reads.values())
        quarantined = {name: why for r in reads.values() for name, why in r.quarantined.items()}
        return _fit_and_publish(job, sorted(reads), data_end, oom, failed, costs, step, quarantined)


def _fit_and_publish(
    job: _Job,
    ready: list[int],
    data_end: int,
    oom: pd.DataFrame | None,
    failed: dict[str, str],
    read_metrics: dict[str, float] | None,
    step: Step,
    quarantined: dict[str, str] | None = None,
) -> Manifest:
    """Phases 1 and 2 over the partitions whose rows are on the store, the fleet reduce between them, the commit."""
    scale, partitions = job.settings.scale, job.partitions
    if oom is not None and job.as_of is not None:
        oom = oom[oom["timestamp"] < job.as_of]
    started = time.perf_counter()
    step(f"fitting {len(ready)} partitions on {len(job.client.scheduler_info()['workers'])} workers")
    fit_futures = {
        i: job.submit("fit", fit_partition, i, job.settings, data_end, _oom_of(oom, partitions[i]), job.source)
        for i in ready
    }
    fleet = FleetStatistics.merge([])

    def fold(fit: PartitionFit) -> PartitionFit:
        nonlocal fleet
        fleet = reduce_fleet(fleet, fit)
        return replace(fit, statistics=FleetStatistics.merge([]))

    fits = _outcomes(fit_futures, partitions, failed, job.deadline, fold)
    _check_tolerance(failed, len(partitions), scale)
    scattered = job.client.scatter(fleet, broadcast=True)
    step(f"calibrating and predicting {len(fits)} partitions with the fleet's factors")
    finish_futures = {
        i: job.submit("finish", finish_partition, i, scattered, job.as_of, job.horizon_seconds) for i in sorted(fits)
    }
    results = _outcomes(finish_futures, partitions, failed, job.deadline)
    _check_tolerance(failed, len(partitions), scale)
    if not results:
        raise DistributedTrainingError(failed, len(partitions), scale.failure_tolerance_fraction)
    fit_seconds = time.perf_counter() - started
    step(f"publishing to {job.store}")
    run = _Run(
        job.settings,
        partitions,
        fits,
        results,
        failed,
        job.source,
        job.horizon_seconds,
        0 if oom is None else len(oom),
        quarantined or {},
    )
    return _commit(job.client, job.version, run, fit_seconds, read_metrics)


def _oom_of(oom: pd.DataFrame | None, partition: Partition) -> pd.DataFrame | None:
    """The OOM events of a partition's workloads (of its namespaces, for a Prometheus partition)."""
    if oom is None:
        return None
    whole = {namespace for namespace, workload in partition.workloads if workload == "*"}
    mine = pd.MultiIndex.from_frame(oom[["namespace", "workload"]]).isin(pd.MultiIndex.from_tuples(partition.workloads))
    return oom[mine | oom["namespace"].isin(whole).to_numpy()].reset_index(drop=True)


@dataclass(frozen=True)
class _Run:
    """What a distributed run gathered, for its manifest."""

    settings: TrainingSettings
    partitions: list[Partition]
    fits: dict[int, PartitionFit]
    results: dict[int, PartitionResult]
    failed: dict[str, str]
    source: str
    horizon_seconds: int
    oom_events: int
    quarantined: dict[str, str]


def _commit(
    client: Client,
    version: VersionWriter,
    run: _Run,
    fit_seconds: float,
    read_metrics: dict[str, float] | None,
) -> Manifest:
    """Stream the partitions' recommendations into one file (each checked against what its task wrote), and commit."""
    order = sorted(run.results)
    first = run.results[order[0]]
    header = RecommendationSet(
        as_of=first.as_of, horizon_seconds=run.horizon_seconds, step_seconds=first.step_seconds, recommendations=[]
    )
    version.collect_partitions(
        header,
        {i: (FileEntry(**run.results[i].recommendations), FileEntry(**run.results[i].model)) for i in order},
    )
    skipped = {
        f"{namespace}/{workload}": f"{p.name} failed: {run.failed[p.name]}"
        for p in run.partitions
        if p.name in run.failed
        for namespace, workload in p.workloads
    }
    workers = client.run(_peak_rss_mib)
    fits = [run.fits[i] for i in order]
    return version.commit(
        source=run.source,
        parameters=run.settings.model_dump(mode="json", include={"histogram", "policy", "reservation", "forecast"}),
        row_counts={
            "usage_rows": sum(f.usage_rows for f in fits),
            "workload_containers": sum(run.results[i].containers for i in order),
            "pods": len(set().union(*(f.pod_names for f in fits))),
            "oom_events": run.oom_events,
            "partitions": len(run.partitions),
            "failed_partitions": len(run.partitions) - len(order),
            "quarantined_containers": len(run.quarantined),
        },
        fit_metrics={
            "fit_seconds": round(fit_seconds, 3),
            "partition_fit_seconds_sum": round(sum(f.fit_seconds for f in fits), 3),
            "partition_fit_seconds_max": round(max(f.fit_seconds for f in fits), 3),
            "workers": float(len(workers)),
            "worker_peak_rss_mib_max": round(max(workers.values()), 1),
            "worker_peak_rss_mib_sum": round(sum(workers.values()), 1),
            "driver_peak_rss_mib": round(_peak_rss_mib(), 1),
            **summarize_selection([run.results[i].choices for i in order]),
        },
        data_window=DataWindow(
            first_sample=min(f.first_sample for f in fits),
            last_sample=max(f.last_sample for f in fits),
            as_of=first.as_of,
        ),
        read_metrics=read_metrics,
        skipped=skipped,
        quarantined=run.quarantined,
    )
