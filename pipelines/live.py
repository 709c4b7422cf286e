"""The live loop (`recommender live`): minute-by-minute updates of the latest version's lines from Prometheus.

The daily training refits every model on 14 days; between two trainings this loop continues the latest version's
models with only the newest samples. Every `live.interval_seconds` it reads the completed steps since its last read
(`PrometheusSource`: the training's batched, bounded, retried queries), continues the decaying histograms exactly and
applies OOM kills (`WorkloadRecommender.live_update`), re-issues the request and its bounds and the short-term line
from the already-fitted forecast models (fast up, no refit), measures each node's pooled high-priority usage at the
read's newest step (`models.nodes.newest_node_usage`, into the version's node lines: `serve` and `sync` offer the
batch / mid room from it, `placement.node_reclaimable`), and publishes a light update beside the version
(`ModelStore.publish_live`) that `serve` and `sync` pick up on their next poll. Its state is checkpointed every few
minutes, so a restart or a failover replays only the steps after the checkpoint; a gap longer than
`live.max_gap_seconds` starts again from the latest version. Only the holder of the Lease writes (`leading`). A step
is read once every scrape up to its end is written (`live.scrape_watermark_query`, beside `live.read_lag_seconds`):
a late scrape is then in the loop's read, as it is in any later read of the same step (a restart's, the training's).

Prometheus down: the read fails after its retries, nothing is written, the served lines age (the pointer's
`written_at`), the errors counter and the last-success timestamp say so, and the next loop reads the whole gap.
"""

from __future__ import annotations

import gc
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from models.live_line import AdaptiveScale, LiveLineForecaster
from models.nodes import LiveNodeUsage, NodeForecaster, measured_activity, measured_climb, newest_node_usage
from models.store import MODEL, LiveUpdate, ModelStore
from models.workload import UNITS, WorkloadRecommender, continue_calibration, pool_calibration
from pipelines.ingest import SampleBounds, no_samples_error, quarantine
from pipelines.partitions import WorkloadName, label_key
from pipelines.prometheus import PrometheusClient
from pipelines.prometheus_source import PrometheusSource
from pipelines.settings import TrainingSettings
from pipelines.train import Parent, with_kinds
from recommender.arrays import FloatArray
from recommender.errors import ModelStoreError, PrometheusError, RecommenderError
from recommender.resources import NodeForecast, RecommendationSet

log = logging.getLogger(__name__)


def _log_step(description: str, /, *, detail: bool = False) -> None:
    """A pass's read progress at debug level (`recommender.progress.Step`): a pass is short, its lines are detail."""
    log.debug(description)


#: Requests, limits and pod placement are read over at least this much of the newest history, seconds: a short read
#: must still find kube-state-metrics' last value (scraped every 30-60 s), and a missing one keeps the known one.
FACTS_WINDOW_SECONDS = 3600
CHECKPOINT_SCHEMA = 1


@dataclass
class PartitionedModel:
    """A version fitted in partitions (the streaming Prometheus path cuts any fleet over `scale.partition_samples`
    into them), continued as one model: each partition's model takes the rows of its workloads (the version's
    plan, as an incremental training assigns them, new workloads too), and the recommendations are the partitions'
    in plan order, at the fleet's decision time, as the version's own file concatenates them."""

    models: dict[int, WorkloadRecommender]
    starts: list[WorkloadName]

    def _partition_of(self, frame: pd.DataFrame) -> npt.NDArray[np.int64]:
        """Each row's partition: the last start at or before its workload in label order (`assign_partitions`),
        found once per distinct workload from integer codes (a MultiIndex's tuples took 0.1 s a pass at 10,000)."""
        namespaces, namespace_names = pd.factorize(frame["namespace"].astype(str), use_na_sentinel=False)
        workloads, workload_names = pd.factorize(frame["workload"].astype(str), use_na_sentinel=False)
        width = max(len(workload_names), 1)
        pair_codes, pairs = pd.factorize(namespaces.astype(np.int64) * width + workloads, use_na_sentinel=False)
        names = [str(name) for name in namespace_names.tolist()], [str(name) for name in workload_names.tolist()]
        keys = np.asarray([label_key((names[0][p // width], names[1][p % width])) for p in pairs.tolist()])
        starts = np.asarray([label_key(start) for start in self.starts])
        found = np.maximum(np.searchsorted(starts, keys, side="right") - 1, 0).astype(np.int64)
        result: npt.NDArray[np.int64] = found[pair_codes]
        return result

    def in_plan_order(self) -> list[WorkloadRecommender]:
        """The partitions' models in plan order (the order their recommendations are listed in)."""
        return [self.models[index] for index in sorted(self.models)]

    def live_update(self, X: pd.DataFrame, oom_events: pd.DataFrame | None = None) -> PartitionedModel:
        usage = _by_partition(X, self._partition_of(X))
        kills = (
            _by_partition(oom_events, self._partition_of(oom_events))
            if oom_events is not None and len(oom_events)
            else None
        )
        ordered = self.in_plan_order()
        before = [{r: getattr(m, f"{r}_live_scale_", None) for r in UNITS} for m in ordered]
        for index, model in self.models.items():
            mine = usage.get(index)
            if mine is not None:
                own = kills.get(index, oom_events.iloc[:0]) if oom_events is not None and kills is not None else None
                model.live_update(mine, oom_events=own)
        pool_calibration(ordered, before)
        return self

    def predict(self, horizon_seconds: int) -> RecommendationSet:
        decision = max(model.data_end_ for model in self.models.values()) + 1
        sets = [model.predict(as_of=decision, horizon_seconds=horizon_seconds) for model in self.in_plan_order()]
        return sets[0].model_copy(update={"recommendations": [r for one in sets for r in one.recommendations]})


def _by_partition(frame: pd.DataFrame, partitions: npt.NDArray[np.int64]) -> dict[int, pd.DataFrame]:
    """The rows of each partition that has any, in their order: one stable sort and one take per partition, where a
    mask per partition read every row 40 times a pass at 10,000 containers."""
    order = np.argsort(partitions, kind="stable")
    found, firsts = np.unique(partitions[order], return_index=True)
    ends = np.append(firsts[1:], order.size)
    return {int(p): frame.take(order[a:b]) for p, a, b in zip(found.tolist(), firsts.tolist(), ends.tolist())}


def _models_of(model: WorkloadRecommender | PartitionedModel) -> list[WorkloadRecommender]:
    """A state's models: its one model, or its partitions' in plan order."""
    return model.in_plan_order() if isinstance(model, PartitionedModel) else [model]


def load_version_model(store: ModelStore, version: str) -> WorkloadRecommender | PartitionedModel:
    """A version's fitted model: its one model, or its partitions' (those that have one) as one."""
    manifest = store.manifest(version)
    if not manifest.partition_starts or MODEL in manifest.files:
        return store.load_model(version)
    parent = Parent(manifest, str(store), None)
    return PartitionedModel(
        {i: store.load_model(version, partition=i) for i in sorted(parent.partitions)}, parent.starts
    )


@dataclass
class LoopState:
    """What a restart resumes from: the continued model of `version`, the end of the last read, and the newest OOM
    kill already applied per container (an `increase()` over the rate window shows one kill at several steps)."""

    version: str
    model: WorkloadRecommender | PartitionedModel
    last_sample: int
    horizon_seconds: int
    nodes: list[NodeForecast]
    kinds: dict[tuple[str, str], str]
    oom_seen: dict[tuple[str, str, str], int] = field(default_factory=dict)
    schema: int = CHECKPOINT_SCHEMA


@dataclass(frozen=True)
class StepReport:
    """One pass of the loop: what was read and what was published (None when nothing was)."""

    start: int
    end: int
    rows: int
    oom_kills: int
    seconds: float
    costs: dict[str, float]
    update: LiveUpdate | None
    #: Wall seconds of the pass's parts: "read" (Prometheus), "update" (`live_update`), "predict", "publish".
    phases: dict[str, float] = field(default_factory=dict)


def with_live_usage(
    nodes: list[NodeForecast],
    measured: dict[str, LiveNodeUsage],
    activity: dict[str, dict[str, float | None]] | None = None,
    lines: dict[str, dict[str, float]] | None = None,
    climbs: dict[str, dict[str, float | None]] | None = None,
) -> list[NodeForecast]:
    """The version's node lines with each measured node's live usage and its time (`serve` and `sync` then offer the
    room from it, `colocation.live_reclaimable`), its recent activity per resource (`activity`: which of the
    calm or active rise tables the room reads), its learned live line (`lines`, from `NodeLiveLines.issue`: the
    room then reserves the larger of it and the rise, `colocation.line_reclaimable`; None where none was issued) and
    its climb into the newest measurement (`climbs`, from `NodeActivity.climbs`: `colocation.climbing_rise`); nodes
    not measured keep their last live usage, which ages out."""
    out = []
    for node in nodes:
        found = measured.get(node.node)
        if found is None:
            out.append(node)
            continue
        update: dict[str, Any] = {"live_sample": found.sample}
        active = (activity or {}).get(node.node, {})
        issued = (lines or {}).get(node.node, {})
        climbed = (climbs or {}).get(node.node, {})
        for resource, value in (("cpu", found.cpu_cores), ("memory", found.memory_bytes)):
            pooled = getattr(node, resource)
            if pooled is not None:
                update[resource] = pooled.model_copy(
                    update={
                        "live_usage": value,
                        "live_activity": active.get(resource),
                        "live_line": issued.get(resource),
                        "live_climb": climbed.get(resource),
                    }
                )
        out.append(node.model_copy(update=update))
    return out


class NodeLiveLines:
    """The node live line, issued every pass: each node's pooled usage grid from the version's node model, extended
    with the live measurements since (the grid slides forward, its width kept), the fitted line
    (`NodeForecaster.fitted_live_line`) applied at its end, calibrated online (`AdaptiveScale`, moved by what the
    steps measured since the last issue showed), as the node backtest scores it (ours_live_line). Not checkpointed:
    after a restart the grid has a gap from the version's end, and a node keeps the rise tables alone until its last
    hour has a measurement again (`models.live_line.usable_rows`)."""

    def __init__(self, model: NodeForecaster | None = None) -> None:
        self.models: dict[str, LiveLineForecaster] = {}
        self.grids: dict[str, FloatArray] = {}
        self.scales: dict[str, AdaptiveScale] = {}
        self.rows: dict[str, int] = {}
        self.step_seconds = 300
        self.end = 0  # Unix seconds: where the grids' last column ends
        self._issued: dict[str, tuple[int, FloatArray]] = {}  # per resource: the grid end it was issued at, lines
        if model is None or not hasattr(model, "nodes_"):
            return
        for resource in ("cpu", "memory"):
            fitted = model.fitted_live_line(resource)
            if fitted is not None:
                self.models[resource] = fitted
                self.grids[resource] = np.array(getattr(model, f"{resource}_grid_"), dtype=np.float64)
                self.scales[resource] = fitted.initial_scale()
        self.rows = {str(name): row for row, name in enumerate(model.nodes_)}
        self.step_seconds = int(model.step_seconds)
        self.end = int(model.grid_end_)

    def continued_from(self, previous: NodeLiveLines) -> NodeLiveLines:
        """These lines with the fleet factor of `previous` (the version before, in this process) where the level is
        the same: a version's line starts at factor 1, as the containers' does (`continue_calibration`)."""
        for resource, scale in self.scales.items():
            old = previous.scales.get(resource)
            if old is not None and old.target_violation == scale.target_violation:
                self.scales[resource] = replace(scale, fleet=old.fleet)
        return self

    def add(self, measured: dict[str, LiveNodeUsage]) -> None:
        """Each measurement into the column of its step; a measurement past the grids' end slides them forward."""
        if not self.models or not measured:
            return
        step = self.step_seconds
        newest = max(usage.sample for usage in measured.values())
        end = (newest // step + 1) * step
        if end > self.end:
            shift = (end - self.end) // step
            for resource, grid in self.grids.items():
                slid = np.full_like(grid, np.nan)
                if shift < grid.shape[1]:
                    slid[:, : grid.shape[1] - shift] = grid[:, shift:]
                self.grids[resource] = slid
            self.end = end
        for node, usage in measured.items():
            row = self.rows.get(node)
            for resource, value in (("cpu", usage.cpu_cores), ("memory", usage.memory_bytes)):
                kept = self.grids.get(resource)
                if row is None or kept is None:
                    continue
                column = kept.shape[1] - (self.end - usage.sample) // step
                if 0 <= column < kept.shape[1]:
                    kept[row, column] = value

    def issue(self) -> dict[str, dict[str, float]]:
        """Per node and resource, the line for the hour after the newest measured step (nodes the model cannot
        serve are left out); the calibration first moves by the steps measured since the previous issue."""
        out: dict[str, dict[str, float]] = {}
        names = list(self.rows)
        for resource, model in self.models.items():
            grid = self.grids[resource]
            previous = self._issued.get(resource)
            if previous is not None and previous[0] < self.end:
                since = grid[:, grid.shape[1] - (self.end - previous[0]) // self.step_seconds :]
                self.scales[resource] = self.scales[resource].updated(previous[1], since)
            lines = model.issue(grid, self.end, self.scales[resource].factors(grid.shape[0]))
            self._issued[resource] = (self.end, lines)
            for row in np.flatnonzero(np.isfinite(lines)):
                out.setdefault(names[row], {})[resource] = float(lines[row])
        return out


class NodeActivity:
    """Each node's live measurements of the last `window_seconds` (plus a step), and its activity from them
    (`measured_activity` per resource, on the node model's `step_seconds`) and climb (`measured_climb`). Not
    checkpointed: after a restart the activity is unknown for a window, and the whole rise table is served meanwhile;
    the climb, for a step."""

    def __init__(self, window_seconds: int, step_seconds: int) -> None:
        self.window_seconds = window_seconds
        self.step_seconds = step_seconds
        self._history: dict[str, dict[str, dict[int, float]]] = {}

    def add(self, measured: dict[str, LiveNodeUsage]) -> None:
        for node, usage in measured.items():
            kept = self._history.setdefault(node, {"cpu": {}, "memory": {}})
            for resource, value in (("cpu", usage.cpu_cores), ("memory", usage.memory_bytes)):
                history = kept[resource]
                history[usage.sample] = value
                for old in [s for s in history if s < usage.sample - self.window_seconds - self.step_seconds]:
                    del history[old]

    def of(self, measured: dict[str, LiveNodeUsage]) -> dict[str, dict[str, float | None]]:
        """Per measured node and resource, its activity up to its newest measurement (None: not known yet)."""
        if self.window_seconds <= 0:
            return {}
        return self._each(
            measured, lambda history, newest: measured_activity(history, newest, self.window_seconds, self.step_seconds)
        )

    def climbs(self, measured: dict[str, LiveNodeUsage]) -> dict[str, dict[str, float | None]]:
        """Per measured node and resource, its climb into its newest measurement (None: no measurement a step
        before it)."""
        return self._each(measured, lambda history, newest: measured_climb(history, newest, self.step_seconds))

    def _each(
        self, measured: dict[str, LiveNodeUsage], read: Callable[[dict[int, float], int], float | None]
    ) -> dict[str, dict[str, float | None]]:
        """`read` of each measured node's history per resource, up to its newest measurement."""
        return {
            node: {resource: read(history, usage.sample) for resource, history in self._history.get(node, {}).items()}
            for node, usage in measured.items()
        }


class LiveMetrics:
    """The loop's own metrics (its /metrics endpoint): when it last succeeded, its errors, its cost per pass."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.last_success = Gauge(
            "koord_recommender_live_last_success_timestamp_seconds",
            "When the loop last published an update (Unix seconds); stops moving while Prometheus is down.",
            registry=self.registry,
        )
        self.last_sample = Gauge(
            "koord_recommender_live_last_sample_timestamp_seconds",
            "End of the newest Prometheus read the published lines include (Unix seconds).",
            registry=self.registry,
        )
        self.errors = Counter(
            "koord_recommender_live_errors", "Passes that failed, by reason.", ["reason"], registry=self.registry
        )
        self.sequence = Gauge(
            "koord_recommender_live_update_sequence",
            "Sequence number of the last update written.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "koord_recommender_live_leader", "1 while this replica holds the Lease and writes.", registry=self.registry
        )
        self.duration = Histogram(
            "koord_recommender_live_pass_seconds",
            "Wall time of one pass (read, update, publish).",
            registry=self.registry,
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.queries = Counter(
            "koord_recommender_live_queries", "Prometheus queries of the loop.", registry=self.registry
        )
        self.bytes = Counter(
            "koord_recommender_live_read_bytes", "Bytes the loop read from Prometheus.", registry=self.registry
        )
        self.checkpoints = Counter("koord_recommender_live_checkpoints", "Checkpoints written.", registry=self.registry)


@contextmanager
def paused_collector() -> Iterator[None]:
    """Python's cyclic collector off for the block: a pass builds ~17 objects per container, whose allocations would
    trigger full collections walking the whole loaded model (a third of `predict`'s CPU at 1,000 containers). The
    pass's objects are freed by reference counting; any cycles among them wait for the next collection after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def always_leading() -> bool:
    """The single-instance answer to "may I write?" (`--no-leader-election`, or no Kubernetes credentials)."""
    return True


class LiveLoop:
    """Continues the latest model version from Prometheus and publishes light updates; see the module docstring."""

    def __init__(
        self,
        settings: TrainingSettings,
        store: ModelStore,
        leading: Callable[[], bool] = always_leading,
        metrics: LiveMetrics | None = None,
        clock: Callable[[], float] = time.time,
        writer: str = "",
    ) -> None:
        """`leading`: whether this replica may write now (the Lease); `writer`: its name in the updates."""
        self.settings = settings
        self.store = store
        self.leading = leading
        self.metrics = metrics or LiveMetrics()
        self.clock = clock
        self.writer = writer or socket.gethostname()
        self.state: LoopState | None = None
        #: each node's newest live measurement (not checkpointed: the first pass after a restart measures again)
        self.measured: dict[str, LiveNodeUsage] = {}
        #: each node's recent measurements, for which of its rise tables the live room reads
        self.activity = NodeActivity(settings.colocation.live_rise_activity_seconds, settings.reservation.step_seconds)
        #: the node live line of the version followed (empty: none fitted, or off)
        self.node_lines = NodeLiveLines()
        self._checkpointed_at = 0.0

    # -- state -------------------------------------------------------------------------------------------------
    def _from_version(self, version: str, now: float) -> LoopState:
        """A fresh state at the end of `version`'s data window (at most `max_gap_seconds` before now)."""
        manifest = self.store.manifest(version)
        loaded = self.store.load(version)
        model = load_version_model(self.store, version)
        step = self.settings.prometheus.step_seconds
        floor = int((now - self.settings.live.max_gap_seconds) // step * step)
        # The reads evaluate on the step grid (`_window` ends on it): the first starts at the step after the one
        # holding the version's newest sample, not at an odd second after it (a range query from an odd start
        # evaluates at other times than the loop's later reads and any later read of the same steps).
        last = manifest.data_window.last_sample // step * step
        if last < floor:
            log.warning(
                "version %s ends %.1f h ago, more than live.max_gap_seconds: reading only the last %.1f h "
                "(the next training reads the rest)",
                version,
                (now - last) / 3600,
                self.settings.live.max_gap_seconds / 3600,
            )
            last = floor
        kinds = {(r.namespace, r.workload): r.kind for r in loaded.recommendations.recommendations if r.kind}
        rec = loaded.recommendations
        return LoopState(version, model, last, rec.horizon_seconds, list(rec.nodes), kinds)

    def resume(self, now: float, replaced: LoopState | None = None) -> LoopState:
        """The checkpoint when it continues the latest version and is recent enough, else the latest version, with
        the live line's calibration of the state it replaces (`replaced`, the loop's own when it follows a new
        version, else a checkpoint of an older one) when that is recent enough (`_calibrated`)."""
        latest = self.store.latest_name()
        if latest is None:
            raise ModelStoreError(f"{self.store}: no model version published yet (run `recommender train`)")
        saved = self.store.load_live_checkpoint()
        if isinstance(saved, LoopState) and saved.schema == CHECKPOINT_SCHEMA and saved.version == latest:
            if now - saved.last_sample <= self.settings.live.max_gap_seconds:
                log.info(
                    "resuming from the checkpoint of version %s at %d (%.0f s to replay)",
                    latest,
                    saved.last_sample,
                    now - saved.last_sample,
                )
                return saved
            log.warning(
                "the checkpoint is %.1f h old, more than live.max_gap_seconds: starting again from version %s",
                (now - saved.last_sample) / 3600,
                latest,
            )
        elif saved is not None:
            log.info("the checkpoint continues another version; starting from version %s", latest)
        else:
            log.info("no checkpoint: starting from version %s", latest)
        donor = replaced if replaced is not None else saved if isinstance(saved, LoopState) else None
        return self._calibrated(self._from_version(latest, now), donor, now)

    def _calibrated(self, fresh: LoopState, donor: LoopState | None, now: float) -> LoopState:
        """`fresh` with the live line's online calibration of `donor` (the state of the version before) carried over
        container by container (`continue_calibration`): a version starts at factor 1 and `train` publishes one a
        day, which threw each day's calibration away. Not from a state older than `live.max_gap_seconds`."""
        if donor is None or donor.schema != CHECKPOINT_SCHEMA or donor.version == fresh.version:
            return fresh
        if now - donor.last_sample > self.settings.live.max_gap_seconds:
            return fresh
        continue_calibration(_models_of(donor.model), _models_of(fresh.model))
        log.info("carried the live line's calibration of version %s into version %s", donor.version, fresh.version)
        return fresh

    def checkpoint(self) -> None:
        """Write the state now (a clean stop, or `checkpoint_interval_seconds` after the last one)."""
        if self.state is None or not self.leading():
            return
        self.store.write_live_checkpoint(self.state)
        self._checkpointed_at = self.clock()
        self.metrics.checkpoints.inc()

    # -- one pass ----------------------------------------------------------------------------------------------
    def _window(self, state: LoopState, now: float) -> tuple[int, int]:
        step = self.settings.prometheus.step_seconds
        end = int((now - self.settings.live.read_lag_seconds) // step * step)
        return state.last_sample + step, end

    def _watermark(self, client: PrometheusClient, now: float) -> int:
        """End of the newest step every scrape has been written past (`live.scrape_watermark_query`), so a step is
        read whole, once: what the loop reads is what any later read of the step finds. No answer (no `up` series,
        e.g. a backfilled TSDB) or no query: no limit beyond the read lag."""
        promql = self.settings.live.scrape_watermark_query
        found = client.query(promql, int(now)) if promql else []
        step = self.settings.prometheus.step_seconds
        return int(min(value for _, value in found) // step * step) if found else int(now)

    def step(self) -> StepReport | None:
        """One pass: follow a newer version, read the steps since the last read, update, publish, checkpoint when
        due. None when there was nothing new to read (the published lines stand). Raises PrometheusError and
        ModelStoreError with nothing written (the caller counts it and tries again next interval)."""
        started = time.perf_counter()
        now = self.clock()
        latest = self.store.latest_name()
        if self.state is None or (latest is not None and latest != self.state.version):
            if self.state is not None:
                log.info("version %s published: continuing it instead of %s", latest, self.state.version)
            self.state = self.resume(now, replaced=self.state)
            self.node_lines = NodeLiveLines(
                self.store.load_node_model(self.state.version) if self.settings.colocation.live_line else None
            ).continued_from(self.node_lines)
        state = self.state
        start, end = self._window(state, now)
        if start > end:
            return None
        prom = self.settings.prometheus
        live_prom = prom.model_copy(
            update={"history_seconds": max(end - start + prom.step_seconds, FACTS_WINDOW_SECONDS)}
        )
        with PrometheusClient(live_prom) as client:
            try:
                end = min(end, self._watermark(client, now))
                if start > end:
                    return None
                read = PrometheusSource(client, live_prom).read(start, end, _log_step)
            finally:
                self.metrics.queries.inc(client.stats.queries)
                self.metrics.bytes.inc(client.stats.bytes)
            costs = client.stats.summary()
        if read.skipped:
            # Every namespace or none: a step applied without some would be lost to them, not replayed.
            raise PrometheusError(f"{len(read.skipped)} batch(es) unreadable: {'; '.join(read.skipped.values())}")
        usage, quarantined = quarantine(read.usage, SampleBounds.at(self.settings.ingest, now), read.nan_samples)
        if usage.empty:
            raise no_samples_error(str(self.settings.prometheus.url), start, end, quarantined)
        if quarantined:
            log.warning("left out %d containers with an impossible sample", len(quarantined))
        phases = {"read": time.perf_counter() - started}
        oom = self._new_oom_kills(state, read.oom_events)
        state.kinds.update(read.workload_kinds)
        update = self.apply(usage, oom, end, costs, phases)
        seconds = time.perf_counter() - started
        self.metrics.duration.observe(seconds)
        return StepReport(start, end, len(usage), len(oom), seconds, costs, update, phases)

    def apply(
        self, usage: pd.DataFrame, oom: pd.DataFrame, end: int, costs: dict[str, float], phases: dict[str, float]
    ) -> LiveUpdate | None:
        """The model part of a pass, after the read: continue the state with the samples up to `end` and the new OOM
        kills, re-issue the recommendations, publish them, checkpoint when due; each part's wall seconds into
        `phases` (the bench measures a pass's model part at fleet sizes without their Prometheus)."""
        state = self.state
        assert state is not None, "apply() continues a resumed state"
        with paused_collector():
            return self._apply(state, usage, oom, end, costs, phases)

    def _apply(
        self,
        state: LoopState,
        usage: pd.DataFrame,
        oom: pd.DataFrame,
        end: int,
        costs: dict[str, float],
        phases: dict[str, float],
    ) -> LiveUpdate | None:
        began = time.perf_counter()
        state.model.live_update(usage, oom_events=oom)
        newest = newest_node_usage(usage)
        self.measured.update(newest)
        self.activity.add(newest)
        self.node_lines.add(newest)
        state.last_sample = end
        phases["update"] = time.perf_counter() - began
        began = time.perf_counter()
        # An unpartitioned model decides at its data end + 1, a partitioned one at the fleet's (the same time).
        recommendations = with_kinds(state.model.predict(horizon_seconds=state.horizon_seconds), state.kinds)
        nodes = with_live_usage(
            state.nodes,
            self.measured,
            self.activity.of(self.measured),
            self.node_lines.issue(),
            self.activity.climbs(self.measured),
        )
        recommendations = recommendations.model_copy(update={"nodes": nodes})
        phases["predict"] = time.perf_counter() - began
        began = time.perf_counter()
        update = self._publish(state, recommendations, costs)
        phases["publish"] = time.perf_counter() - began
        if (
            update is not None
            and self.clock() - self._checkpointed_at >= self.settings.live.checkpoint_interval_seconds
        ):
            self.checkpoint()
        return update

    def _new_oom_kills(self, state: LoopState, events: pd.DataFrame) -> pd.DataFrame:
        """The kills not applied yet: one kill shows as an increase at every step of the rate window after it, and
        a read may end inside that run; later steps of a run already applied are dropped."""
        if events.empty:
            return events
        window = self.settings.prometheus.cpu_rate_window_seconds
        keep = []
        for index, row in events.sort_values("timestamp").iterrows():
            key = (str(row["namespace"]), str(row["pod"]), str(row["container"]))
            seen = state.oom_seen.get(key)
            if seen is None or int(row["timestamp"]) - seen > window:
                keep.append(index)
                state.oom_seen[key] = int(row["timestamp"])
        return events.loc[keep]

    def _publish(
        self, state: LoopState, recommendations: RecommendationSet, costs: dict[str, float]
    ) -> LiveUpdate | None:
        if not self.leading():
            log.warning("lost the Lease during the pass: not writing (the new leader resumes from the checkpoint)")
            return None
        update = self.store.publish_live(
            recommendations,
            version=state.version,
            last_sample=state.last_sample,
            read_metrics=costs,
            retained=self.settings.live.retained_updates,
            writer=self.writer,
        )
        self.metrics.last_success.set(update.written_at)
        self.metrics.last_sample.set(state.last_sample)
        self.metrics.sequence.set(update.sequence)
        return update

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, on_report: Callable[[StepReport], None] = lambda _: None) -> None:
        """Pass every `interval_seconds` until `stop`; a follower waits for the Lease, a failed pass is counted and
        retried next interval; a clean stop writes a checkpoint."""
        interval = self.settings.live.interval_seconds
        was_leading = False
        while not stop.is_set():
            began = time.monotonic()
            leading = self.leading()
            self.metrics.leader.set(float(leading))
            if leading != was_leading:
                log.info("holding the Lease: writing" if leading else "not the leader: waiting for the Lease")
                if leading:
                    self.state = None  # a new leader resumes from the store: the old one may have moved on
                was_leading = leading
            if leading:
                try:
                    report = self.step()
                except PrometheusError as error:
                    self.metrics.errors.labels(reason="prometheus").inc()
                    log.warning("live pass failed, the last update stays served: %s", error)
                except ModelStoreError as error:
                    self.metrics.errors.labels(reason="store").inc()
                    log.warning("live pass failed: %s", error)
                except RecommenderError as error:  # bad settings or data: say so, try again, keep what is served
                    self.metrics.errors.labels(reason="other").inc()
                    log.warning("live pass failed: %s", error)
                else:
                    if report is not None:
                        on_report(report)
            stop.wait(max(0.0, interval - (time.monotonic() - began)))
        self.checkpoint()
