"""Training, one path for one process and a cluster: plan partitions -> read each -> fit each -> reduce the fleet's
statistics -> finish each -> commit one version (or, for the `recommend` contract, return its recommendations).

The executor seam (`Executor`) runs each phase over the partitions: `InProcessExecutor` here (a default run from a
file is one partition, the whole fleet, and gives what one fit on everything gives; from Prometheus the read and
the fit stream partition by partition, `_Run.read_and_fit`, and give what one partition gives), `pipelines.distributed.DaskExecutor` on a
Dask cluster (many partitions, each read and fitted by a task, so no process holds the fleet's samples). What is
per partition (rows, fitted models, results) waits between the phases in the partition's workspace
(`pipelines.partitions`); what needs the whole fleet is folded over the partitions' fits on the driver
(`FleetReduction`): the sample interval, the calibration sketches and the pooled node usage the node model is fitted
on. Node lines, workload kinds, incremental training and partial tolerance therefore work the same on both.

Failures: a partition that fails (after `scale.retries` on a cluster) is named; within
`scale.failure_tolerance_fraction` of the partitions the rest is published with its workloads in the manifest's
`skipped`, beyond it nothing is (a run of one partition fails with the partition's own error). `allow_partial` is
about one partition's Prometheus read: a namespace batch that fails after the client's retries is recorded in
`skipped` and the partition goes on with the rest, where without it the partition fails.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
import logging
import multiprocessing
import resource
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pandas as pd

from models.placed import last_node_sample
from models.store import MODEL, DataWindow, Manifest, ModelStore, VersionWriter, partition_model
from pipelines.ingest import SampleBounds, no_samples_error, quarantine, read_oom_events, read_usage
from pipelines.partitions import (
    Kept,
    MemoryWorkspace,
    Partition,
    RowWindow,
    StoredWorkspace,
    WorkloadName,
    Workspace,
    assign_partitions,
    containers_of,
    inventory,
    plan_partitions,
    split_file,
    whole_fleet,
)
from pipelines.prometheus import PrometheusClient
from pipelines.prometheus_source import PrometheusSource, ReadPlan
from pipelines.settings import ScaleSettings, TrainingSettings
from recommender.errors import (
    ConfigurationError,
    DistributedTrainingError,
    InputFileError,
    ModelStoreError,
    PartialDataError,
    PrometheusError,
    TrainingMemoryError,
)
from recommender.progress import Step, quiet
from recommender.resources import NodeForecast, RecommendationSet
from recommender.text import printable

if TYPE_CHECKING:
    from models.nodes import NodeForecaster, PooledNodeUsage
    from models.workload import FleetStatistics, ResourceForecast, WorkloadRecommender
    from recommender.arrays import FloatArray, UInt64Array
    from recommender.settings import ForecastSettings

log = logging.getLogger(__name__)

#: The estimators' modules, imported where a run first needs them rather than with this module: their import
#: (scikit-learn, and SciPy under it: about 0.8 s) then runs while Prometheus answers a streamed run's first read
#: (`import_estimators`).
ESTIMATOR_MODULES = ("models.workload", "models.nodes")


def import_estimators() -> None:
    """Import `ESTIMATOR_MODULES` (what a fit or an unpickled model would import anyway)."""
    for name in ESTIMATOR_MODULES:
        importlib.import_module(name)


#: `end_at` shifts by whole steps of the tidy format, so samples keep their place on the 5-minute grid.
SHIFT_STEP_SECONDS = 300
#: Workload containers per partition on a cluster when `scale.partition_containers` is unset.
CLUSTER_PARTITION_CONTAINERS = 500


class Executor(Protocol):
    """Runs one phase's function over the partitions. `in_memory`: the partitions' state stays in this process
    (memory workspaces, no scratch files); otherwise it waits on the store for tasks elsewhere."""

    in_memory: bool

    def map(
        self,
        phase: str,
        function: Callable[..., Any],
        calls: dict[int, tuple[Any, ...]],
        keep: Callable[[Any], Any],
        step: Step,
    ) -> tuple[dict[int, Any], dict[int, BaseException]]:
        """`function(*calls[i])` for every partition i: what `keep` makes of each result as it arrives, and the
        errors of those that failed."""
        ...

    def share(self, value: Any) -> Any:
        """`value` as the tasks should receive it (sent once to every worker, on a cluster)."""
        ...

    def workers(self) -> int: ...

    def peak_memory_mib(self) -> dict[str, float]:
        """Each worker process's peak resident memory, MiB."""
        ...


def peak_rss_mib() -> float:
    """This process's peak resident memory, MiB: Linux's VmHWM (of this program, where ru_maxrss would carry over
    the parent's peak into a forked or spawned worker), else ru_maxrss (kB)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), None)
    return int(line.split()[1]) / 1024 if line else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


#: glibc's mallopt parameters (malloc.h) and what a streamed read sets them to: blocks of 4 MiB and more (a
#: partition's float columns, the grids, the estimators' big temporaries) are mapped on their own and given back
#: when freed, where glibc's default threshold grows with each big block freed until such blocks come from a heap
#: that keeps them. Below it, the per-row masks and codes of a partition (1-4 MB each, made and freed by the hundred)
#: are reused from the heap: mapped on their own (a 1 MiB threshold) each one was fresh pages to fault in, 5-8 CPU
#: seconds of a 1,000-container pass in the kernel (docs/benchmarks.md). A heap (the main one, and each thread's)
#: grows and shrinks by at least `TOP_PAD_BYTES` at its top: with glibc's 128 KiB, the heaps of the choice's
#: temporaries were given back and faulted in again over and over (1.2 of a pass's 3.5 system CPU seconds). Every
#: thread allocates from the main heap (`M_ARENA_MAX` 1): a heap per thread (the reader's, the query threads', the
#: CPU choice's) each kept the pages its thread had freed, 500-900 MiB of a 1,000-container run held free (against
#: 100-190 in one heap, for the same CPU seconds; docs/benchmarks.md, "Training memory").
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
MMAP_THRESHOLD_BYTES = 4 << 20
TOP_PAD_BYTES = 64 << 20


def map_big_blocks() -> None:
    """Let freed big blocks leave the process at once, keep a heap's top padded and every thread on one heap (see
    `M_MMAP_THRESHOLD`; nothing where glibc is not). Called before any other thread allocates."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, 8 * MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TOP_PAD, TOP_PAD_BYTES)
        libc.mallopt(M_ARENA_MAX, 1)


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`; nothing elsewhere). glibc keeps the
    pages of freed blocks below its mmap threshold, which grows with the big frames freed before, so without this
    the process' RSS keeps each partition's peak although the rows are gone."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


#: The calls a side process inherits at its fork (`fork_side_process`), by name: set in this process just before the
#: fork and let go just after, so the child holds the only reference to what they carry.
_INHERITED: dict[str, Callable[..., Any]] = {}


def fork_side_process(stack: ExitStack, inherit: dict[str, Callable[..., Any]]) -> ProcessPoolExecutor | None:
    """A process of one worker forked now, for the fleet's memory forecasts beside CPU's (`fit_fleet_forecasts`) and
    the node model: two threads of one process shared the GIL and, on every fresh page, the address space's lock, so
    the choice ran at 1.25x of one core; two processes take a core each. Forked once a streamed read is done, so the
    child already holds the estimators' modules and the fleet's grids (their pages shared, nothing imported twice).
    `inherit`: calls it gets at the fork, run there by `inherited` with small arguments, so their data (memory's
    grids, the node pools) is never pickled through its pipe. Only while no other thread runs (a fork copies no
    thread but the caller, and a lock one of them held would stay held in the child): else None, and the work takes
    threads. Shut down (and joined) with `stack`; a worker whose parent dies sees its pipe close."""
    if threading.active_count() > 1 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    release_freed_memory()  # pages the heap keeps free would stay in the child as this process reuses them
    _INHERITED.update(inherit)
    try:
        side = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
        side.submit(int)  # a forking pool forks its worker within the first submit: now, with `_INHERITED` set
    finally:
        _INHERITED.clear()
    stack.callback(side.shutdown, cancel_futures=True)
    return side


def memory_forecasts(
    grids: list[FloatArray],
    keys: list[UInt64Array],
    more_grids: list[FloatArray],
    more_keys: list[UInt64Array],
    settings: ForecastSettings,
    grid_end: int,
) -> list[ResourceForecast]:
    """Memory's forecasts of the partitions a side process inherited (`grids`, `keys`) and of those fitted after its
    fork (`more_grids`, `more_keys`, sent with the call), chosen as one fleet (`fit_resource_forecasts`)."""
    from models.workload import fit_resource_forecasts

    return fit_resource_forecasts(grids + more_grids, settings, grid_end, keys=keys + more_keys)


def inherited(name: str, *args: Any) -> Any:
    """In the side process: the call `name` it inherited at its fork (`fork_side_process`), given `args`; the pages
    its temporaries freed then leave the process, which otherwise idles holding them until the run ends."""
    try:
        return _INHERITED[name](*args)
    finally:
        release_freed_memory()


class InProcessExecutor:
    """The phases in this process, partition after partition: memory follows the partition being fitted."""

    in_memory = True

    def map(
        self,
        phase: str,
        function: Callable[..., Any],
        calls: dict[int, tuple[Any, ...]],
        keep: Callable[[Any], Any],
        step: Step,
    ) -> tuple[dict[int, Any], dict[int, BaseException]]:
        done: dict[int, Any] = {}
        failed: dict[int, BaseException] = {}
        for count, (index, args) in enumerate(calls.items(), 1):
            try:
                done[index] = keep(function(*args))
            except Exception as error:
                failed[index] = error
            if len(calls) > 1:
                step(f"{phase}: {count} of {len(calls)} partitions", detail=True)
        return done, failed

    def share(self, value: Any) -> Any:
        return value

    def workers(self) -> int:
        return 1

    def peak_memory_mib(self) -> dict[str, float]:
        return {"this process": peak_rss_mib()}


# -- the phases (module functions: a cluster's tasks pickle them by name) ----------------------------------------


@dataclass(frozen=True)
class PartitionRead:
    """What reading a partition found besides its rows (which are in its workspace)."""

    index: int
    last_sample: int | None
    last_node_sample: int | None
    oom_events: pd.DataFrame | None = None
    kinds: dict[WorkloadName, str] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    quarantined: dict[str, str] = field(default_factory=dict)


def read_prometheus_partition(
    partition: Partition,
    workspace: Workspace,
    settings: TrainingSettings,
    start: int,
    end: int,
    allow_partial: bool,
    step: Step = quiet,
    shared: SharedRead | None = None,
) -> PartitionRead:
    """Read a partition's namespaces (every query scoped to them; the whole fleet unscoped) and keep the rows in
    its workspace. A namespace batch that fails after the client's retries fails the partition unless
    `allow_partial`. `shared`: the run's client and the per-container facts it read once for every partition (in
    this process), so a partition asks only for its usage; without it (a cluster's task) the partition reads its
    own facts with its own client."""
    namespaces = partition.namespaces
    if namespaces == []:
        return PartitionRead(partition.index, None, None)
    prom = settings.prometheus
    if shared is not None:
        read = PrometheusSource(shared.client, prom).read(start, end, step, shared.plan.scoped(namespaces, prom))
        costs: dict[str, float] = {}  # counted once for the run by the shared client
    else:
        with PrometheusClient(prom) as client:
            read = PrometheusSource(client, prom, namespaces).read(start, end, step)
            costs = client.stats.summary()
    if read.skipped and not allow_partial:
        raise PartialDataError(read.skipped)
    usage, quarantined = quarantine(read.usage, SampleBounds.at(settings.ingest, time.time()), read.nan_samples)
    if usage.empty and read.skipped:  # allowed: every batch of the partition was skipped, nothing to fit
        return PartitionRead(partition.index, None, None, costs=costs, skipped=read.skipped, quarantined=quarantined)
    if usage.empty:
        raise no_samples_error(str(prom.url), start, end, quarantined)
    workspace.put_input(usage)
    return PartitionRead(
        partition.index,
        int(usage["timestamp"].max()),
        last_node_sample(usage),
        read.oom_events,
        read.workload_kinds,
        costs,
        read.skipped,
        quarantined,
    )


@dataclass(frozen=True)
class SharedRead:
    """What the partitions of a Prometheus read in this process share: one client and the facts read once."""

    client: PrometheusClient
    plan: ReadPlan


@dataclass(frozen=True)
class FitPlan:
    """What every partition's fit shares: the fleet's newest sample (all forecast grids end at its step) and newest
    sample of a high-priority pod on a node (the node pools' grid end; None: each partition's own, the pools are
    aligned as they merge), the node model to pool for (the parent's in an incremental run), and the parent version
    whose partition models are continued."""

    settings: TrainingSettings
    data_end: int
    node_data_end: int | None
    node_model: NodeForecaster | None
    parent_store: str | None = None
    parent_version: str | None = None
    parent_partitions: frozenset[int] = frozenset()
    #: The forecasts are left to the driver, which fits them on every partition at once as one fleet
    #: (`fit_fleet_forecasts`): partitions held in this process, so a partitioned fit equals one fit.
    fleet_forecasts: bool = False


@dataclass(frozen=True)
class PartitionFit:
    index: int
    statistics: FleetStatistics
    nodes: PooledNodeUsage | None
    usage_rows: int
    pod_names: list[str]
    first_sample: int | None
    last_sample: int | None
    fit_seconds: float


def new_workload_model(settings: TrainingSettings) -> WorkloadRecommender:
    """The one construction of the workload estimator from settings."""
    from models.workload import WorkloadRecommender

    return WorkloadRecommender.from_settings(settings)


def new_node_model(settings: TrainingSettings) -> NodeForecaster:
    """The one construction of the node estimator from settings."""
    from models.nodes import NodeForecaster

    return NodeForecaster.from_settings(settings, settings.colocation)


def pool_partition(plan: FitPlan, usage: pd.DataFrame | None) -> PooledNodeUsage | None:
    """A partition's rows pooled per node (none without a node model or placement)."""
    if usage is None or plan.node_model is None or "node" not in usage.columns:
        return None
    return plan.node_model.pool(usage, plan.node_data_end)


def fit_partition(
    partition: Partition,
    workspace: Workspace,
    plan: FitPlan,
    oom_events: pd.DataFrame | None,
    source: str,
    pooled: bool = False,
) -> PartitionFit:
    """Fit a partition (or continue its parent's model with the newer rows), keep the model in its workspace, and
    return its share of the fleet's statistics and of the pooled node usage (none when `pooled`: the caller pooled
    its rows before, `pool_partition`)."""
    started = time.perf_counter()
    usage = workspace.take_input(source)
    continued = plan.parent_store is not None and partition.index in plan.parent_partitions
    model = (
        ModelStore(plan.parent_store).load_model(plan.parent_version, partition=partition.index)
        if plan.parent_store is not None and continued
        else new_workload_model(plan.settings)
    )
    nodes = None
    if usage is not None:
        if continued:
            model = model.partial_fit(usage, oom_events=oom_events, data_end=plan.data_end)
        else:
            model = model.fit(
                usage, oom_events=oom_events, data_end=plan.data_end, fit_forecasts=not plan.fleet_forecasts
            )
        if not pooled:
            nodes = pool_partition(plan, usage)
    workspace.put_fitted(model)
    rows = usage if usage is not None else pd.DataFrame({"pod": [], "timestamp": []})
    fit = PartitionFit(
        index=partition.index,
        statistics=no_statistics() if plan.fleet_forecasts else model.fleet_statistics(),
        nodes=nodes,
        usage_rows=len(rows),
        pod_names=sorted(rows["pod"].unique().tolist()),
        first_sample=int(rows["timestamp"].min()) if len(rows) else None,
        last_sample=int(rows["timestamp"].max()) if len(rows) else None,
        fit_seconds=time.perf_counter() - started,
    )
    del usage, rows  # the partition's rows go here: its estimators have taken what they keep
    return fit


def fit_node_model(
    settings: TrainingSettings,
    parent: NodeForecaster | None,
    nodes: PooledNodeUsage,
    as_of: int | None,
    horizon_seconds: int,
) -> tuple[NodeForecaster, list[NodeForecast]]:
    """The node model fitted on the fleet's pooled node usage (or the parent's continued), and its lines at `as_of`."""
    model = parent.partial_fit_pooled(nodes) if parent is not None else new_node_model(settings).fit_pooled(nodes)
    return model, node_forecasts(model, as_of, horizon_seconds)


def node_forecasts(model: NodeForecaster | None, as_of: int | None, horizon_seconds: int) -> list[NodeForecast]:
    """The node lines of `model` at `as_of` (none without a model)."""
    return [] if model is None else model.predict(as_of=as_of, horizon_seconds=horizon_seconds)


def no_statistics() -> FleetStatistics:
    """The fleet statistics of no partition (what a folded fit keeps, or one whose forecasts the driver fits)."""
    from models.workload import FleetStatistics

    return FleetStatistics.merge([])


@dataclass(frozen=True)
class FleetReduction:
    """The fleet-level quantities, folded over the partitions' fits as they arrive (one merged value each on the
    driver, never one per partition): add a field and its merge in `add` for a further fleet-level step."""

    statistics: FleetStatistics = field(default_factory=no_statistics)
    nodes: PooledNodeUsage | None = None

    def add(self, fit: PartitionFit) -> FleetReduction:
        from models.workload import FleetStatistics

        merged = self.with_nodes(fit.nodes)
        return replace(merged, statistics=FleetStatistics.merge([self.statistics, fit.statistics]))

    def with_nodes(self, nodes: PooledNodeUsage | None) -> FleetReduction:
        """This reduction with a partition's node pool merged in (`fit_partition`'s, or `pool_partition`'s)."""
        from models.nodes import PooledNodeUsage

        return replace(self, nodes=PooledNodeUsage.merge([self.nodes, nodes]))


@dataclass(frozen=True)
class PartitionResult:
    index: int
    containers: int
    choices: dict[str, Any]
    vpa: dict[str, float]
    as_of: int
    step_seconds: int
    kept: Kept


def finish_partition(
    partition: Partition,
    workspace: Workspace,
    fleet: FleetStatistics,
    as_of: int | None,
    horizon_seconds: int,
    kinds: dict[WorkloadName, str],
) -> PartitionResult:
    """Calibrate a partition's model with the fleet, predict at `as_of` (with the workloads' kinds where the owner
    discovery found them), and keep the recommendations and the model in its workspace."""
    model = workspace.take_fitted().calibrate_with_fleet(fleet)
    recommendations = with_kinds(model.predict(as_of=as_of, horizon_seconds=horizon_seconds), kinds)
    return PartitionResult(
        index=partition.index,
        containers=len(recommendations.recommendations),
        choices=model.selection_choices(),
        vpa=model.vpa_summary(),
        as_of=recommendations.as_of,
        step_seconds=recommendations.step_seconds,
        kept=workspace.put_results(recommendations, model),
    )


def with_kinds(recommendations: RecommendationSet, kinds: dict[WorkloadName, str]) -> RecommendationSet:
    """The recommendations with each workload's kind (from the owner discovery) where it is known."""
    if not kinds:
        return recommendations
    return recommendations.model_copy(
        update={
            "recommendations": [
                r.model_copy(update={"kind": kinds.get((r.namespace, r.workload), r.kind)})
                for r in recommendations.recommendations
            ]
        }
    )


# -- the driver ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parent:
    """The version an incremental run continues: its plan and node model (its partition models are loaded by the
    partitions' fits)."""

    manifest: Manifest
    store: str
    node_model: NodeForecaster | None

    @property
    def starts(self) -> list[WorkloadName]:
        return [tuple(s) for s in self.manifest.partition_starts]  # type: ignore[misc]

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions of its plan that have a model (one that failed, tolerated, or read nothing has none)."""
        if MODEL in self.manifest.files:
            return frozenset({0})
        return frozenset(
            i for i in range(len(self.manifest.partition_starts)) if partition_model(i) in self.manifest.files
        )


def _parent(settings: TrainingSettings, incremental: bool) -> Parent | None:
    """The latest verified version to continue from, or None for a full fit (none asked for, or none yet)."""
    if not incremental:
        return None
    store = ModelStore(settings.store.path, settings.store.retention_versions)
    if store.latest_name() is None:
        return None
    manifest = store.manifest()
    if MODEL not in manifest.files and not manifest.partition_starts:
        raise ModelStoreError(
            f"{store}: version {manifest.version} records neither a model nor the partition plan to continue "
            "from; run a full fit (without --incremental)"
        )
    return Parent(manifest, str(store), store.load_node_model(manifest.version))


@dataclass
class _Run:
    """One training run's inputs and what its phases gathered."""

    settings: TrainingSettings
    executor: Executor
    store: ExitStack | None
    source: str
    as_of: int | None
    horizon_seconds: int
    step: Step
    parent: Parent | None = None
    partitions: list[Partition] = field(default_factory=list)
    workspaces: dict[int, Workspace] = field(default_factory=dict)
    reads: dict[int, PartitionRead] = field(default_factory=dict)
    failed: dict[int, BaseException] = field(default_factory=dict)
    oom_events: pd.DataFrame | None = None
    shift: int = 0
    started: float = field(default_factory=time.perf_counter)
    #: The fits, fleet and results of a streamed read (`read_and_fit`), which fitted as it read.
    streamed: tuple[dict[int, PartitionFit], FleetReduction, dict[int, PartitionResult]] | None = None
    #: Seconds the fit waited for a partition's read (what the read-ahead did not hide; the cluster path: 0).
    read_wait_seconds: float = 0.0
    #: The node model and its lines, fitted beside the fleet's forecast choice and the finish (`_finish`): in the side
    #: process, ahead of memory's forecasts, or else in a thread; the node pools are complete once the partitions are
    #: fitted (a streamed read: once its last partition is read and pooled, before that partition's fit).
    node_fit: Future[tuple[NodeForecaster, list[NodeForecast]]] | None = None
    #: The node model's fit as a call, run here should the side process have died under it.
    node_call: Callable[[], tuple[NodeForecaster, list[NodeForecast]]] | None = None
    #: Where the fleet's memory forecasts are chosen beside CPU's (`fork_side_process`; None: a thread).
    side: ProcessPoolExecutor | None = None
    #: The partitions' models whose grids the side process inherited for memory's choice (`_start_side`); None until
    #: it is started. A partition fitted after the fork sends its grid with the call.
    side_models: list[WorkloadRecommender] | None = None
    #: The side process's peak resident memory, for the manifest: read as it ends (`_end_side`).
    side_peak: dict[str, float] = field(default_factory=dict)
    _version: VersionWriter | None = None

    def plan(self, containers: dict[WorkloadName, int] | None, default_size: int | None = None) -> None:
        """Partitions of the fleet (`containers` per workload; None: unknown, the whole fleet in one) and their
        workspaces: the parent's plan in an incremental run, else cut by `scale.partition_containers` (unset: 500
        on a cluster, `default_size` in this process)."""
        size = self.settings.scale.partition_containers
        if size is None:
            size = default_size if self.executor.in_memory else CLUSTER_PARTITION_CONTAINERS
        starts = self.parent.starts if self.parent is not None else []
        if len(starts) > 1:
            if containers is None:
                raise ConfigurationError("an incremental run of a partitioned version needs the fleet's workloads")
            self.partitions = assign_partitions(containers, starts)
        elif containers is None or (self.parent is not None) or size is None:
            self.partitions = whole_fleet() if containers is None else plan_partitions(containers, None)
        else:
            self.partitions = plan_partitions(containers, size)
        for p in self.partitions:
            self.workspaces[p.index] = (
                MemoryWorkspace()
                if self.executor.in_memory
                else StoredWorkspace.of(self._writer("a cluster's partitions"), p.index)
            )

    def _writer(self, what: str) -> VersionWriter:
        """The version this run writes, begun when first needed (after the input has been read, for a run in this
        process: bad input leaves the store untouched) and removed unless committed when `store` closes."""
        if self.store is None:
            raise ConfigurationError(f"{what} need a model store")
        if self._version is None:
            store = ModelStore(self.settings.store.path, self.settings.store.retention_versions)
            self._version = self.store.enter_context(store.writer())
        return self._version

    def run(
        self, phase: str, function: Callable[..., Any], calls: dict[int, tuple[Any, ...]], keep: Callable[[Any], Any]
    ) -> dict[int, Any]:
        done, failed = self.executor.map(phase, function, calls, keep, self.step)
        for index, error in failed.items() if len(self.partitions) > 1 else ():  # one partition: its error is raised
            log.warning("%s failed: %s", printable(self.partitions[index].name), printable(_why(error)))
        self.failed.update(failed)
        self.check_tolerance()
        return done

    def check_tolerance(self) -> None:
        """Refuse to go on when more partitions failed than tolerated (with the error itself for a run of one)."""
        scale: ScaleSettings = self.settings.scale
        if len(self.failed) <= scale.failure_tolerance_fraction * len(self.partitions) and len(self.failed) < len(
            self.partitions
        ):
            return
        if len(self.partitions) == 1:
            raise next(iter(self.failed.values()))
        raise DistributedTrainingError(
            {self.partitions[i].name: _why(e) for i, e in sorted(self.failed.items())},
            len(self.partitions),
            scale.failure_tolerance_fraction,
        )

    def fit_and_finish(self) -> tuple[dict[int, PartitionFit], FleetReduction, dict[int, PartitionResult]]:
        """Fit the partitions (read before, or streamed: `read_and_fit`), fold their fleet statistics, finish them
        with the fleet's."""
        if self.streamed is not None:
            return self.streamed
        reads = {i: r for i, r in self.reads.items() if i not in self.failed}
        ends = [r.last_sample for r in reads.values() if r.last_sample is not None]
        node_ends = [r.last_node_sample for r in reads.values() if r.last_node_sample is not None]
        plan = self._fit_plan(max(ends), max(node_ends) if node_ends else None, bool(node_ends))
        # A partition with no rows is fitted only to carry its parent's model on (a skipped read has nothing).
        reads = {i: r for i, r in reads.items() if r.last_sample is not None or i in plan.parent_partitions}
        shared = self.executor.share(plan)
        oom = self.oom_events
        if oom is not None and self.as_of is not None:
            oom = oom[oom["timestamp"] < self.as_of]
        self.oom_events = oom
        self._fitting(len(reads))
        reduction = FleetReduction()

        def fold(fit: PartitionFit) -> PartitionFit:
            nonlocal reduction
            reduction = reduction.add(fit)
            return replace(fit, statistics=no_statistics(), nodes=None)

        calls = {
            i: (self.partitions[i], self.workspaces[i], shared, self._oom_of(oom, i, r), self.source)
            for i, r in sorted(reads.items())
        }
        fits: dict[int, PartitionFit] = self.run("fit", fit_partition, calls, fold)
        return self._finish(plan, fits, reduction)

    def _fit_plan(self, data_end: int, node_data_end: int | None, nodes: bool) -> FitPlan:
        """The plan every partition's fit shares (`nodes`: some partition has high-priority rows on nodes)."""
        if self.parent is not None and self.parent.node_model is not None:
            node_model: NodeForecaster | None = self.parent.node_model
        else:
            node_model = new_node_model(self.settings) if nodes else None
        return FitPlan(
            self.settings,
            data_end,
            node_data_end,
            node_model,
            self.parent.store if self.parent else None,
            self.parent.manifest.version if self.parent else None,
            self.parent.partitions if self.parent else frozenset(),
            fleet_forecasts=self.executor.in_memory and len(self.partitions) > 1 and self.parent is None,
        )

    def _fitting(self, partitions: int) -> None:
        if len(self.partitions) > 1:
            what = f"{partitions} partitions on {self.executor.workers()} workers"
        else:
            what = (
                f"{self.partitions[0].containers} workload containers" if self.partitions[0].containers else "the fleet"
            )
        self.step(f"{'continuing' if self.parent else 'fitting'} {what}")

    def read_and_fit(
        self, read: Callable[[Partition], PartitionRead], data_end: int, reads_done: Callable[[], None]
    ) -> None:
        """Read and fit the partitions in this process as a stream: partition i+1 is read in a thread (and answered by
        Prometheus in its own process) while partition i is fitted, one read ahead at most, so the rows held are
        about two partitions' and each partition's are freed once its estimators have taken them. `data_end`: the
        fleet's newest sample (`PrometheusSource.newest_step`), which every partition's grid ends at; node pools
        end at their own partition's newest sample and are aligned as they merge. `reads_done`: called once every
        read is in (the client closes and its query threads end, so the side process can then be forked)."""
        assert self.executor.in_memory, "a cluster reads and fits in its tasks"
        fits: dict[int, PartitionFit] = {}
        total = len(self.partitions)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prometheus-read") as reader:
            ahead: Future[PartitionRead] | None = reader.submit(read, self.partitions[0])
            import_estimators()  # while Prometheus answers the first read
            plan = self._fit_plan(data_end, None, True)
            self._fitting(len(self.partitions))
            reduction = FleetReduction()
            for number, partition in enumerate(self.partitions, 1):
                assert ahead is not None
                current, ahead = ahead, None
                waiting = time.perf_counter()
                try:
                    got: PartitionRead | None = current.result()
                except Exception as error:
                    self.failed[partition.index], got = error, None
                self.read_wait_seconds += time.perf_counter() - waiting
                if number < total:
                    ahead = reader.submit(read, self.partitions[number])
                if got is not None:
                    self.reads[partition.index] = got
                    if got.last_sample is not None or partition.index in plan.parent_partitions:
                        oom = self._oom_of(None, partition.index, got)
                        early = number == total > 1
                        if early:  # every read is in: the reader's and the client's threads end, so a fork can be made
                            reader.shutdown(wait=True)
                            reads_done()
                            reduction = self._start_side_before_last_fit(plan, fits, reduction, partition)
                        try:
                            fit = fit_partition(
                                partition, self.workspaces[partition.index], plan, oom, self.source, pooled=early
                            )
                        except Exception as error:
                            self.failed[partition.index] = error
                        else:
                            reduction = reduction.add(fit)
                            fits[partition.index] = replace(fit, statistics=no_statistics(), nodes=None)
                        release_freed_memory()
                if partition.index in self.failed and total > 1:
                    log.warning(
                        "%s failed: %s", printable(partition.name), printable(_why(self.failed[partition.index]))
                    )
                self.check_tolerance()
                if total > 1:
                    self.step(f"read and fitted {number} of {total} partitions", detail=True)
        if not fits:
            raise PrometheusError(f"{self.source}: no usage samples to fit")
        self.oom_events = pd.concat(
            [r.oom_events for r in self.reads.values() if r.oom_events is not None], ignore_index=True
        )
        if self.side_models is None:
            reads_done()  # the client's query threads end: the side process can be forked
        self.streamed = self._finish(plan, fits, reduction)

    def _finish(
        self, plan: FitPlan, fits: dict[int, PartitionFit], reduction: FleetReduction
    ) -> tuple[dict[int, PartitionFit], FleetReduction, dict[int, PartitionResult]]:
        """The node model and the fleet's forecasts, each beside the other (in the side process, started here
        unless a streamed read started it before its last fit, which inherits their data), then the partitions'
        recommendations."""
        if self.side_models is None:
            self._start_side(plan, fits, reduction)
        models = self._fleet_models(sorted(fits)) if plan.fleet_forecasts else []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="node-model") as thread:
            if self.node_call is not None and self.node_fit is None:
                self.node_fit = thread.submit(self.node_call)
            if models:
                reduction = self._fleet_forecasts(models, reduction)
            return self._finish_partitions(fits, reduction)

    def _start_side_before_last_fit(
        self, plan: FitPlan, fits: dict[int, PartitionFit], reduction: FleetReduction, last: Partition
    ) -> FleetReduction:
        """The side process started before the `last` partition's fit, with the node pools made whole by its rows
        (pooled first, `pool_partition`), so the node model runs there while that partition is fitted here instead
        of after it on a core of its own; the reduction with its pool."""
        workspace = self.workspaces[last.index]
        assert isinstance(workspace, MemoryWorkspace)
        reduction = reduction.with_nodes(pool_partition(plan, workspace.usage))
        self._start_side(plan, fits, reduction)
        return reduction

    def _start_side(self, plan: FitPlan, fits: dict[int, PartitionFit], reduction: FleetReduction) -> None:
        """The node model's call on the fleet's pools (`reduction`) and, where a fork can be made, the side process
        with what it inherits: the node model, started in it at once, and memory's choice on the grids of the
        partitions fitted so far (`fits`)."""
        self.side_models = self._fleet_models(sorted(fits)) if plan.fleet_forecasts else []
        if reduction.nodes is not None:
            parent = self.parent.node_model if self.parent else None
            self.node_call = functools.partial(
                fit_node_model, self.settings, parent, reduction.nodes, self.as_of, self.horizon_seconds
            )
        inherit = self._side_work(self.side_models)
        if inherit and self.store is not None:
            self.side = fork_side_process(self.store, inherit)
        if "memory" not in inherit:
            self.side_models = []  # memory's forecasts stay in this process
        if self.node_call is not None:
            self.node_fit = self.beside(inherited, "node")

    def _finish_partitions(
        self, fits: dict[int, PartitionFit], reduction: FleetReduction
    ) -> tuple[dict[int, PartitionFit], FleetReduction, dict[int, PartitionResult]]:
        self.step(f"computing recommendations with the fleet's calibration ({len(fits)} partitions)")
        fleet = self.executor.share(reduction.statistics)
        finishing = {
            i: (self.partitions[i], self.workspaces[i], fleet, self.as_of, self.horizon_seconds, self.reads[i].kinds)
            for i in sorted(fits)
        }
        results: dict[int, PartitionResult] = self.run("finish", finish_partition, finishing, lambda r: r)
        return fits, reduction, results

    def _side_work(self, models: list[WorkloadRecommender]) -> dict[str, Callable[..., Any]]:
        """What a side process would inherit: the node model's fit, and memory's forecast choice on the `models`'
        grids where they fit `scale.side_process_max_grid_mib`."""
        from models.workload import selection_keys

        work: dict[str, Callable[..., Any]] = {"node": self.node_call} if self.node_call is not None else {}
        grids_mib = sum(m.memory_grid_.nbytes for m in models) / 2**20
        if models and grids_mib <= self.settings.scale.side_process_max_grid_mib:
            work["memory"] = functools.partial(
                memory_forecasts, [m.memory_grid_ for m in models], selection_keys(models)
            )
        return work

    def _fleet_models(self, fitted: list[int]) -> list[WorkloadRecommender]:
        """The fitted models of the partitions `fitted`, held in this process."""
        models = []
        for i in fitted:
            workspace = self.workspaces[i]
            assert isinstance(workspace, MemoryWorkspace) and workspace.fitted is not None
            models.append(workspace.fitted)
        return models

    def _fleet_forecasts(self, models: list[WorkloadRecommender], reduction: FleetReduction) -> FleetReduction:
        """The forecasts of the partitions' `models`, chosen and calibrated on all of them as one fleet (memory's in
        the side process where it inherited the grids of `side_models`; a partition fitted after its fork sends its
        own), and the fleet statistics they give (the calibration sketches exist only once the forecasts do)."""
        from models.workload import FleetStatistics, fit_fleet_forecasts, selection_keys

        self.step(f"choosing the forecasts of {len(models)} partitions as one fleet")
        known = self.side_models or []
        assert all(a is b for a, b in zip(models, known)), "the side process's partitions come first, in order"
        later = models[len(known) :]

        def memory_elsewhere(settings: ForecastSettings, grid_end: int) -> Future[list[ResourceForecast]]:
            more = ([m.memory_grid_ for m in later], selection_keys(later))
            asked = self.beside(inherited, "memory", *more, settings, grid_end)
            if asked is None:
                raise BrokenExecutor("the side process is gone")
            return asked

        def chosen() -> None:
            if self.node_fit is None or self.node_fit.done():  # the side process's work is in (the node model's first)
                self._end_side()

        fit_fleet_forecasts(models, memory_elsewhere if known and self.side is not None else None, chosen)
        release_freed_memory()  # the choice's and the live lines' temporaries: freed, but kept by the heap until now
        return replace(reduction, statistics=FleetStatistics.merge([m.fleet_statistics() for m in models]))

    def beside(self, function: Callable[..., Any], *args: Any) -> Future[Any] | None:
        """`function(*args)` submitted to the side process; None without one (or once it died: then forgotten)."""
        if self.side is None:
            return None
        try:
            return self.side.submit(function, *args)
        except BrokenExecutor:
            log.warning("the side process died; the rest of the run takes threads of this one")
            self.side = None
            return None

    def _end_side(self) -> None:
        """Keep the side process's peak resident memory (its pages shared since the fork counted) and end it, once
        its work is in: idle to the run's end, it held what it inherited and this process has let go since (the
        last partition's rows, the heap as it was: 200 MiB of its own at 1,000 containers)."""
        asked = self.beside(peak_rss_mib)
        try:
            if asked is not None:
                self.side_peak = {"side_peak_rss_mib": round(asked.result(), 1)}
        except BrokenExecutor:
            pass
        if self.side is not None:
            self.side.shutdown()
            self.side = None

    def _oom_of(self, oom: pd.DataFrame | None, index: int, read: PartitionRead) -> pd.DataFrame | None:
        """A partition's OOM events: those its own read found, or its workloads' share of the run's."""
        if read.oom_events is not None:
            return read.oom_events
        if oom is None or len(self.partitions) == 1:
            return oom
        return oom[self.partitions[index].owns(oom).to_numpy()].reset_index(drop=True)

    def node_lines(self) -> tuple[NodeForecaster | None, list[NodeForecast]]:
        """The node model and lines of `_finish`'s side thread (its error, if any, raised here); without pooled node
        usage, the parent's model unchanged."""
        if self.node_fit is None:
            parent = self.parent.node_model if self.parent else None
            return parent, node_forecasts(parent, self.as_of, self.horizon_seconds)
        self.step("fitting the node model (beside the forecast choice)")
        try:
            return self.node_fit.result()
        except BrokenExecutor:
            assert self.node_call is not None
            log.warning("the side process died; fitting the node model here")
            return self.node_call()

    def recommendations(self) -> RecommendationSet:
        """The `recommend` contract's result: the partitions' recommendations (kept in memory) in order."""
        _, _, results = self.fit_and_finish()
        first = results[min(results)]
        return RecommendationSet(
            as_of=first.as_of,
            horizon_seconds=self.horizon_seconds,
            step_seconds=first.step_seconds,
            recommendations=[r for i in sorted(results) for r in results[i].kept.recommendations.recommendations],
            nodes=self.node_lines()[1],
        )

    def commit(self, read_metrics: dict[str, float] | None = None) -> Manifest:
        """Fit and finish, then write the version and its manifest (the one manifest builder)."""
        from models.workload import summarize_selection

        writer = self._writer("training runs")
        fits, _, results = self.fit_and_finish()
        order = sorted(results)
        first = results[order[0]]
        node_model, node_lines = self.node_lines()
        self._end_side()
        fit_seconds = time.perf_counter() - self.started
        header = RecommendationSet(
            as_of=first.as_of,
            horizon_seconds=self.horizon_seconds,
            step_seconds=first.step_seconds,
            recommendations=[],
            nodes=node_lines,
        )
        self.step(f"publishing to {self.settings.store.path}")
        kept = [results[i].kept for i in order]
        # Models written by the partitions' tasks are partition files, however many partitions there were: the
        # plan is recorded with them, so `--incremental` can continue one partition as it continues several.
        collected = all(k.files is not None for k in kept)
        partitioned = len(self.partitions) > 1 or collected
        if collected:
            writer.collect_partitions(header, {i: results[i].kept.files for i in order})  # type: ignore[misc]
        else:
            writer.write_recommendations(
                header.model_copy(
                    update={"recommendations": [r for k in kept for r in k.recommendations.recommendations]}
                )
            )
            for i, k in zip(order, kept, strict=True):
                assert k.model is not None
                if partitioned:
                    writer.write_partition_model(i, k.model)
                else:
                    writer.write_model(k.model)
        if node_model is not None:
            writer.write_node_model(node_model)
        done = [fits[i] for i in order]
        firsts = [f.first_sample for f in done if f.first_sample is not None]
        lasts = [f.last_sample for f in done if f.last_sample is not None]
        if self.parent is not None:
            firsts.append(self.parent.manifest.data_window.first_sample)
            lasts.append(self.parent.manifest.data_window.last_sample)
        skipped = {
            f"{namespace}/{workload}": f"{p.name} failed: {_why(self.failed[p.index])}"
            for p in self.partitions
            if p.index in self.failed
            for namespace, workload in p.workloads
        }
        reads = [self.reads[i] for i in sorted(self.reads) if i not in self.failed]
        for r in reads:
            skipped.update(r.skipped)
        quarantined = {name: why for r in reads for name, why in r.quarantined.items()}
        workers = self.executor.peak_memory_mib()
        vpa: dict[str, float] = {}
        for i in order:
            for key, value in results[i].vpa.items():
                vpa[key] = vpa.get(key, 0.0) + value
        return writer.commit(
            source=self.source,
            parameters=self.settings.model_dump(
                mode="json", include={"histogram", "policy", "reservation", "forecast"}
            ),
            row_counts={
                "usage_rows": sum(f.usage_rows for f in done),
                "workload_containers": sum(results[i].containers for i in order),
                "pods": len(set().union(*(f.pod_names for f in done))),
                "nodes": len(header.nodes),
                "oom_events": 0 if self.oom_events is None else len(self.oom_events),
                "partitions": len(self.partitions),
                "failed_partitions": len(self.failed),
                "quarantined_containers": len(quarantined),
            },
            fit_metrics={
                "fit_seconds": round(fit_seconds, 3),
                "partition_fit_seconds_sum": round(sum(f.fit_seconds for f in done), 3),
                "partition_fit_seconds_max": round(max(f.fit_seconds for f in done), 3),
                "workers": float(len(workers)),
                "worker_peak_rss_mib_max": round(max(workers.values()), 1),
                "worker_peak_rss_mib_sum": round(sum(workers.values()), 1),
                "driver_peak_rss_mib": round(peak_rss_mib(), 1),
                **self.side_peak,
                **summarize_selection([results[i].choices for i in order]),
                **vpa,
            },
            data_window=DataWindow(first_sample=min(firsts), last_sample=max(lasts), as_of=first.as_of),
            read_metrics=read_metrics,
            skipped=skipped,
            quarantined=quarantined,
            parent_version=self.parent.manifest.version if self.parent else None,
            partition_starts=[p.start for p in self.partitions] if partitioned else None,
        )


@contextmanager
def _memory_named(run: _Run) -> Iterator[None]:
    """The run's MemoryError (numpy's `Unable to allocate ...`: the fleet does not fit in this process) as one line
    that says what to do instead (`TrainingMemoryError`)."""
    try:
        yield
    except MemoryError as error:
        containers = sum(p.containers or 0 for p in run.partitions)
        raise TrainingMemoryError(run.source, containers, len(run.partitions), str(error) or "MemoryError") from None


def _why(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# -- files --------------------------------------------------------------------------------------------------------


def _stage_file(run: _Run, input_path: Path, window: RowWindow, end_at: int | None, bounds: SampleBounds) -> None:
    """Plan a usage file's partitions and put each one's rows in its workspace: read whole into this process for
    an in-memory executor, streamed in two passes onto the store for a cluster (`pipelines.partitions`). The
    `end_at` shift is measured on the rows before as-of, and the parent's window is cut after it."""
    before = RowWindow(as_of=window.as_of)
    if run.executor.in_memory:
        run.step(f"reading {input_path}")
        usage = before.apply(read_usage(input_path, bounds))
        if usage.empty:
            raise InputFileError(input_path, _no_rows(window, None))
        if end_at is not None:
            window = replace(window, shift=_shift(end_at, int(usage["timestamp"].max())))
        usage = replace(window, as_of=None).apply(usage)
        if usage.empty:
            raise InputFileError(input_path, _no_rows(window, run.parent))
        run.plan(containers_of(usage))
        if len(run.partitions) == 1:
            run.workspaces[0].put_input(usage)
        else:
            for p in run.partitions:
                if p.workloads:
                    run.workspaces[p.index].put_input(usage[p.owns(usage).to_numpy()].reset_index(drop=True))
        last, node_end = int(usage["timestamp"].max()), last_node_sample(usage)
        del usage
    else:
        run.step(f"listing workloads in {input_path}")
        if end_at is not None:
            window = replace(window, shift=_shift(end_at, inventory(input_path, before, bounds).last_sample))
        try:
            found = inventory(input_path, window, bounds)
        except InputFileError:
            raise InputFileError(input_path, _no_rows(window, run.parent)) from None
        run.plan(found.containers)
        run.step(f"splitting {found.rows:,} rows into {len(run.partitions)} partitions")
        split_file(input_path, run.partitions, run.workspaces, window, bounds)  # type: ignore[arg-type]
        last, node_end = found.last_sample, found.last_node_sample
    run.reads = {p.index: PartitionRead(p.index, last, node_end) for p in run.partitions}
    run.shift = window.shift


def _shift(end_at: int, last_sample: int) -> int:
    return (end_at - last_sample) // SHIFT_STEP_SECONDS * SHIFT_STEP_SECONDS


def _no_rows(window: RowWindow, parent: Parent | None) -> str:
    if parent is not None:
        return (
            f"has no rows after {parent.manifest.data_window.last_sample}, the end of version {parent.manifest.version}"
        )
    return "has no usage rows" + (f" before as-of {window.as_of}" if window.as_of is not None else "")


def recommend_from_file(
    input_path: Path, as_of: int, horizon_seconds: int, settings: TrainingSettings, step: Step = quiet
) -> RecommendationSet:
    """The `recommend` contract: learn only from rows before `as_of`, forecast the horizon after it (in this
    process; in partitions when `scale.partition_containers` is set)."""
    run = _Run(settings, InProcessExecutor(), None, str(input_path), as_of, horizon_seconds, step)
    with _memory_named(run):
        _stage_file(run, input_path, RowWindow(as_of=as_of), None, SampleBounds.at(settings.ingest, time.time()))
        return run.recommendations()


def train_from_file(
    input_path: Path,
    settings: TrainingSettings,
    *,
    as_of: int | None = None,
    oom_events_path: Path | None = None,
    horizon_seconds: int = 86400,
    incremental: bool = False,
    end_at: int | None = None,
    executor: Executor | None = None,
    step: Step = quiet,
) -> Manifest:
    """Fit on a usage file and publish a new model version; a failure anywhere leaves the store untouched.

    `incremental`: continue the latest version's models (each partition's, by its plan) with only the rows after
    its data window. `end_at`: move every timestamp by the same whole number of 5-minute steps so the newest sample
    lands at most one step before this Unix time (the demo's old trace then reads as current); the file is not
    touched, the source says so. `executor`: where the phases run (default: this process)."""
    bounds = SampleBounds.at(settings.ingest, time.time())
    parent = _parent(settings, incremental)
    window = RowWindow(as_of=as_of, after=parent.manifest.data_window.last_sample if parent else None)
    with ExitStack() as store:
        run = _Run(
            settings, executor or InProcessExecutor(), store, str(input_path), as_of, horizon_seconds, step, parent
        )
        with _memory_named(run):
            _stage_file(run, input_path, window, end_at, bounds)
            if oom_events_path is not None:
                run.oom_events = RowWindow(after=window.after, shift=run.shift).apply(
                    read_oom_events(oom_events_path, bounds)
                )
            if end_at is not None:
                run.source += (
                    f" (timestamps moved {run.shift / 86400:+.1f} days at load so the data ends now; the file is "
                    "unchanged)"
                )
            return run.commit()


# -- Prometheus ---------------------------------------------------------------------------------------------------


def prometheus_window(settings: TrainingSettings, as_of: int | None) -> tuple[int, int]:
    """First and last step (Unix seconds) of the `history_seconds` read before `as_of` (default: now)."""
    prom = settings.prometheus
    end = int((time.time() if as_of is None else as_of - 1) // prom.step_seconds * prom.step_seconds)
    return end - prom.history_seconds, end


def train_from_prometheus(
    settings: TrainingSettings,
    *,
    as_of: int | None = None,
    allow_partial: bool = False,
    horizon_seconds: int = 86400,
    incremental: bool = False,
    executor: Executor | None = None,
    step: Step = quiet,
) -> tuple[Manifest, dict[str, float]]:
    """Read the last `history_seconds` from Prometheus, fit, publish; returns the manifest and the query costs.

    In partitions of whole namespaces: in this process streamed, of about `scale.partition_samples` samples each
    (`_stream_prometheus`; a fleet that fits in one partition is read unscoped); on a cluster each read by its own
    scoped queries in a task. See the module's docstring for `allow_partial` and the failure tolerance.
    `incremental`: continue the latest version's models, reading only the steps after its data window.
    """
    prom = settings.prometheus
    start, end = prometheus_window(settings, as_of)
    parent = _parent(settings, incremental)
    if parent is not None:
        start = max(start, parent.manifest.data_window.last_sample + prom.step_seconds)
        if start > end:
            raise PrometheusError(
                f"nothing new since {parent.manifest.data_window.last_sample}, the end of version {parent.manifest.version}"
            )
        if len(parent.starts) > 1 and any(workload != "*" for _, workload in parent.starts[1:]):
            raise ConfigurationError(
                f"version {parent.manifest.version} was partitioned by workload (from a file); Prometheus reads whole "
                "namespaces, so continue it from a file or run a full fit"
            )
    runner = executor or InProcessExecutor()
    started = time.perf_counter()
    with ExitStack() as store:
        run = _Run(settings, runner, store, str(prom.url), as_of, horizon_seconds, step, parent)
        with _memory_named(run):
            if runner.in_memory:
                costs = _stream_prometheus(run, start, end, allow_partial)
            else:
                costs = _read_prometheus_partitions(run, start, end, allow_partial)
            costs.setdefault("read_seconds", round(time.perf_counter() - started, 3))
            costs["read_wait_seconds"] = round(run.read_wait_seconds, 3)
            return run.commit(read_metrics=costs), costs


def _stream_prometheus(run: _Run, start: int, end: int, allow_partial: bool) -> dict[str, float]:
    """In this process: the per-container facts and the fleet's newest sample read once, the namespaces planned
    into partitions of about `scale.partition_samples` samples, then read and fitted as a stream (`read_and_fit`).
    Returns the query costs."""
    settings, step = run.settings, run.step
    prom = settings.prometheus
    map_big_blocks()
    client = run.store.enter_context(PrometheusClient(prom))  # type: ignore[union-attr]
    source = PrometheusSource(client, prom)
    started = time.perf_counter()
    facts = source.plan(start, end, step)
    data_end = source.newest_step(start, end)
    facts_seconds = time.perf_counter() - started
    if data_end is None:
        raise PrometheusError(f"{prom.url}: no usage samples between {start} and {end}")
    steps = (end - start) // prom.step_seconds + 1
    # Whole namespaces: a partition is named `ns/*` as a skipped Prometheus batch is.
    run.plan(
        {(namespace, "*"): n for namespace, n in facts.containers.items()},
        max(1, settings.scale.partition_samples // steps),
    )
    if len(run.partitions) == 1:  # one partition reads everything, unscoped
        run.partitions, run.workspaces = whole_fleet(), {0: run.workspaces[0]}
    total = len(run.partitions)
    step(f"reading {prom.url} and fitting" + (f" in {total} partitions, one read ahead" if total > 1 else ""))
    shared = SharedRead(client, facts)

    reading: list[float] = []  # seconds each partition's read took, in the reading thread

    def read(partition: Partition) -> PartitionRead:
        progress = step if total == 1 else quiet
        began = time.perf_counter()
        try:
            return read_prometheus_partition(
                partition, run.workspaces[partition.index], settings, start, end, allow_partial, progress, shared
            )
        finally:
            reading.append(time.perf_counter() - began)

    run.read_and_fit(read, data_end, client.close)
    return {**client.stats.summary(), "read_seconds": round(facts_seconds + sum(reading), 3)}


def _read_prometheus_partitions(run: _Run, start: int, end: int, allow_partial: bool) -> dict[str, float]:
    """On a cluster: the namespaces discovered and planned into partitions, each read (facts and usage, scoped to
    its namespaces) by a task into its workspace on the store. Returns the query costs of the reads."""
    settings, step = run.settings, run.step
    prom = settings.prometheus
    step(f"discovering containers in {prom.url}")
    with PrometheusClient(prom) as prometheus:
        counts = PrometheusSource(prometheus, prom).containers_per_namespace(start, end)
    run.plan({(namespace, "*"): n for namespace, n in counts.items()})
    step(f"reading {prom.url} in {len(run.partitions)} partitions")
    calls = {p.index: (p, run.workspaces[p.index], settings, start, end, allow_partial) for p in run.partitions}
    run.reads = run.run("read", read_prometheus_partition, calls, lambda r: r)
    if not any(r.last_sample is not None for r in run.reads.values()):
        raise PrometheusError(f"{prom.url}: no usage samples between {start} and {end}")
    reads = list(run.reads.values())
    run.oom_events = pd.concat([r.oom_events for r in reads if r.oom_events is not None], ignore_index=True)
    keys = sorted({key for r in reads for key in r.costs})
    return {key: float(sum(r.costs.get(key, 0.0) for r in reads)) for key in keys}
