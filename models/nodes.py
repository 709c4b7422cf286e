"""The node resource model: pooled usage of each node's high-priority pods and its forecasts (issue 6).

Koordinator's four lines per node come from the pods placed on it. The reservations here are forecasts of the
node's *pooled* high-priority usage (sum over its pod containers of each one's 5-minute max), made by the same
selected and calibrated forecasters as the workload lines (`models.ensemble`). Forecasting the sum rather than
summing per-pod forecasts is the pooling effect: pods rarely peak together, so the peak of the sum is well below the
sum of the peaks, and a calibrated line on the sum keeps its violation target at node level.

Pure estimator over a tidy usage frame with a `node` column: no clients, one step beside the per-workload fit so
the two can be scheduled independently. Rows of borrowing pods (`priority_class` koord-batch or koord-free, when
the column is present) are left out: they use the reclaimed room rather than reserve it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from models._validation import factorize_labels, require_columns
from models.forecast import nan_quantile, usage_grid
from models.live_line import LiveLineForecaster
from models.migration import migrate_node_state
from models.placed import high_priority_rows
from models.pods import USAGE_COLUMNS
from models.settings import ModelSettings
from models.workload import FleetForecaster
from recommender import colocation
from recommender.arrays import FloatArray, IntArray, maximum_at_cells
from recommender.resources import NodeForecast, NodePod, NodeResourceLines
from recommender.settings import ColocationSettings, LiveLineSettings

RESOURCE_COLUMNS = {
    "cpu": ("cpu_cores", "cpu_request_cores", "cpu_limit_cores"),
    "memory": ("memory_bytes", "memory_request_bytes", "memory_limit_bytes"),
}
SECONDS_PER_DAY = 86400


def group_sums(rows: FloatArray, group_of: IntArray, n_groups: int) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """(groups x columns) sum of `rows` over each group's rows (NaN counted as 0) and where any of them is not NaN.
    The k-th rows of all groups are added at once, so each group's rows are added in their order, the same floats as
    `np.add.at` gives (whose unbuffered loop costs several times more) in as many steps as the largest group has rows."""
    sums = np.zeros((n_groups, rows.shape[1]))
    seen = np.zeros((n_groups, rows.shape[1]), dtype=bool)
    order = np.argsort(group_of, kind="stable")
    groups = group_of[order]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]]) if len(groups) else groups
    rank = np.arange(len(groups)) - np.repeat(starts, np.diff(np.r_[starts, len(groups)]))
    for k in range(int(rank.max()) + 1 if len(rank) else 0):
        kth = order[rank == k]
        sums[group_of[kth]] += np.nan_to_num(rows[kth])
        seen[group_of[kth]] |= ~np.isnan(rows[kth])
    return sums, seen


def node_sums(
    instance_codes: IntArray,
    instance_node: IntArray,
    times: FloatArray,
    values: FloatArray,
    n_instances: int,
    n_nodes: int,
    end_seconds: float,
    n_steps: int,
    step_seconds: int,
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """(nodes x steps) pooled usage as a sum per step over the node's pod containers of each one's max, and where
    any container of the node has a sample: the two add up across partitions of the fleet."""
    per_instance = usage_grid(instance_codes, times, values, n_instances, end_seconds, n_steps, step_seconds)
    return group_sums(per_instance, instance_node, n_nodes)


@dataclass(frozen=True)
class LiveNodeUsage:
    """One node's pooled high-priority usage at its newest sampled step (`newest_node_usage`), cores and bytes."""

    sample: int
    cpu_cores: float
    memory_bytes: float


def newest_node_usage(usage: pd.DataFrame) -> dict[str, LiveNodeUsage]:
    """Per node, the pooled usage of its high-priority pod containers at the node's newest sampled step, as
    Koordinator's usage policy counts it (`colocation.koordinator_hp_used`): each container's value at that step,
    its last request (limit where none) when it has no sample there. Containers are those of the rows (a live read:
    the pods that reported in it); nodes without such rows are left out."""
    if "node" not in usage.columns:
        return {}
    rows = high_priority_rows(usage)
    if rows.empty:
        return {}
    keys = ["node", "namespace", "pod", "container"]
    rows = rows.assign(node=rows["node"].astype(str)).sort_values("timestamp", kind="stable")
    newest = rows.groupby("node")["timestamp"].transform("max")
    last = rows.groupby(keys, sort=True).last()
    at_newest = rows[rows["timestamp"] == newest].groupby(keys)[[c for c, _, _ in RESOURCE_COLUMNS.values()]].max()
    out_values = {}
    for resource, (column, request, limit) in RESOURCE_COLUMNS.items():
        missing = pd.Series(np.nan, index=last.index)
        asked: FloatArray = np.asarray(last.get(request, missing).fillna(last.get(limit, missing)), dtype=np.float64)
        measured: FloatArray = np.asarray(at_newest[column].reindex(last.index), dtype=np.float64)
        per_pod = colocation.koordinator_hp_used("usage", measured[:, None], asked[:, None])
        out_values[resource] = pd.Series(per_pod, index=last.index).groupby(level="node").sum()
    samples = newest.groupby(rows["node"]).max()
    return {
        str(node): LiveNodeUsage(int(samples[node]), float(out_values["cpu"][node]), float(out_values["memory"][node]))
        for node in samples.index
    }


@dataclass(frozen=True)
class PooledNodeUsage:
    """What the node model learns from, in a form partitions of the fleet add up: per node (sorted) and step, the sum
    of its high-priority pod containers' usage and whether any had a sample, and one row per pod container on a
    node (`NodeForecaster._instances`). A pod container is on one node and its workload in one partition."""

    nodes: list[str]
    data_end: int
    grid_end: int
    sums: dict[str, FloatArray]
    observed: dict[str, npt.NDArray[np.bool_]]
    instances: pd.DataFrame
    step_seconds: int

    def grid(self, resource: str) -> FloatArray:
        """(nodes x steps) pooled usage, NaN where no container of the node has a sample."""
        result: FloatArray = np.where(self.observed[resource], self.sums[resource], np.nan)
        return result

    @classmethod
    def merge(cls, parts: list[PooledNodeUsage | None]) -> PooledNodeUsage | None:
        """The pools of partitions of one fleet as one; None when none has any. A pool whose grid ends earlier (its
        partition's newest sample is older: partitions pooled as they stream in) is moved onto the latest end, as
        the fleet's one pool would hold it: its oldest steps fall out of the window, the newest are empty."""
        present = [p for p in parts if p is not None]
        if len(present) < 2:
            return present[0] if present else None
        grid_end = max(p.grid_end for p in present)
        nodes = sorted(set().union(*(p.nodes for p in present)))
        index = pd.Index(nodes)
        sums, observed = {}, {}
        for resource in present[0].sums:
            steps = present[0].sums[resource].shape[1]
            sums[resource] = np.zeros((len(nodes), steps))
            observed[resource] = np.zeros((len(nodes), steps), dtype=bool)
            for part in present:
                rows = index.get_indexer(pd.Index(part.nodes))
                late = min((grid_end - part.grid_end) // part.step_seconds, steps)
                sums[resource][rows, : steps - late] += part.sums[resource][:, late:]
                observed[resource][rows, : steps - late] |= part.observed[resource][:, late:]
        # In the order one fit on the fleet's rows gives: by first sample, then as the rows sort.
        keys = ["namespace", "pod", "container", "node"]
        instances = (
            pd.concat([p.instances for p in present])
            .reset_index()
            .sort_values(["first_sample", "namespace", "workload", "pod", "container"], kind="stable")
            .set_index(keys)
        )
        data_end = max(p.data_end for p in present)
        return cls(nodes, data_end, grid_end, sums, observed, instances, present[0].step_seconds)


def rise_allowance(grid: FloatArray, quantile: float, steps: int) -> FloatArray:
    """Per row, the `quantile` of the rises between consecutive steps over the last `steps` (0 when none is known):
    how far usage can climb between two measurements, so the last measurement plus this is a safe floor."""
    recent = grid[:, -(steps + 1) :]
    rises = np.diff(recent, axis=1)
    result: FloatArray = (
        np.nan_to_num(np.maximum(nan_quantile(rises, quantile), 0.0)) if rises.shape[1] else np.zeros(grid.shape[0])
    )
    return result


def level_rise_table(grid: FloatArray, reference: FloatArray, band_fraction: float, steps: int) -> FloatArray:
    """Per row of `grid` (nodes x steps, ending at the decision) and level bin (`colocation.LEVEL_BINS` of the row's
    `reference`), the largest rise between consecutive steps of the last `steps` that started from a level within
    `band_fraction` x reference of the bin: how far the node climbed in one step from about that level (Mondrian by
    node and level band; a node idling can jump by a whole burst, a busy one only by what is left). A bin no step
    started near takes the node's largest rise; 0 where none is known. Only the columns given are read: a line built
    from it at the grid's end sees nothing after it (`colocation.level_rise` reads it)."""
    level, rises = _recent_rises(grid, steps)
    banded, largest = _banded_rises(level, rises, ~np.isnan(level) & ~np.isnan(rises), reference, band_fraction)
    result: FloatArray = np.maximum(
        np.where(np.isfinite(banded), banded, np.where(np.isfinite(largest), largest, 0)), 0
    )
    return result


def activity_rise_tables(
    grid: FloatArray, reference: FloatArray, band_fraction: float, steps: int, activity_steps: int, whole: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """`level_rise_table` (`whole`, of the same arguments) split by how active each node was before a rise started
    (`node_activity` over `activity_steps`): (the calm steps' table, the active steps' table, the boundary per node:
    the median activity of the steps learned from, calm at or below it; NaN without any). A node calm for a while
    climbs by less than one in the middle of a burst, so a level measured after calm keeps a calm node's rises. A
    cell no step of its class fell in takes the whole table's value; nothing after the grid's end is read."""
    level, rises = _recent_rises(grid, steps)
    activity = node_activity(grid, activity_steps)[:, -(steps + 1) : -1] if grid.shape[1] else level
    known = ~np.isnan(level) & ~np.isnan(rises) & ~np.isnan(activity)
    edge = np.full(grid.shape[0], np.nan)
    has = known.any(axis=1)
    edge[has] = [float(np.median(activity[row][known[row]])) for row in np.flatnonzero(has)]
    calm = activity <= edge[:, None]
    tables = []
    for part in (calm, ~calm):
        banded, _ = _banded_rises(level, rises, known & part, reference, band_fraction)
        tables.append(np.maximum(np.where(np.isfinite(banded), banded, whole), 0))
    return tables[0], tables[1], edge


def node_activity(grid: FloatArray, steps: int) -> FloatArray:
    """Per node and step, the largest |change| of its usage between consecutive steps over the `steps` changes up
    to that step (the last one into it included; NaN where none is known): how active the node has just been."""
    change = np.abs(np.diff(grid, axis=1, prepend=np.nan))
    padded = np.pad(change, ((0, 0), (max(steps, 1) - 1, 0)), constant_values=np.nan)
    result: FloatArray = np.fmax.reduce(sliding_window_view(padded, max(steps, 1), axis=1), axis=2)
    return result


def measured_activity(history: dict[int, float], newest: int, window_seconds: int, step_seconds: int) -> float | None:
    """`node_activity` of a node's live measurements (sample time -> value): the largest |change| between two
    `step_seconds` apart among those of the last `window_seconds` up to `newest`. None until the measurements cover
    the window from its start (a loop just started has not seen it: the whole rise table is kept)."""
    if not history or min(history) > newest - window_seconds:
        return None
    changes = [
        abs(value - history[sample - step_seconds])
        for sample, value in history.items()
        if newest - window_seconds < sample <= newest and sample - step_seconds in history
    ]
    return max(changes) if changes else None


def measured_climb(history: dict[int, float], newest: int, step_seconds: int) -> float | None:
    """How far a node's live measurements (sample time -> value) rose into the `newest` from the one `step_seconds`
    before it (negative: a fall); None without both (`colocation.climbing_rise` adds a factor of it to the rise)."""
    if newest not in history or newest - step_seconds not in history:
        return None
    return history[newest] - history[newest - step_seconds]


def _recent_rises(grid: FloatArray, steps: int) -> tuple[FloatArray, FloatArray]:
    """The levels the last `steps` rises of `grid` started from, and those rises (nodes x steps)."""
    recent = grid[:, -(steps + 1) :]
    return recent[:, :-1], np.diff(recent, axis=1)


def _banded_rises(
    level: FloatArray, rises: FloatArray, use: npt.NDArray[np.bool_], reference: FloatArray, band_fraction: float
) -> tuple[FloatArray, FloatArray]:
    """Per node and level bin the largest of the rises `use` marks that started within `band_fraction` x reference
    of the bin (-inf where none did), and per node the largest of them (nodes x 1)."""
    rows, _ = np.nonzero(use)
    bins = colocation.level_bin(level, np.asarray(reference, dtype=np.float64)[:, None])
    table = np.full((level.shape[0], colocation.LEVEL_BINS), -np.inf)
    maximum_at_cells(table, rows, bins[use], rises[use])
    width = int(round(band_fraction * colocation.LEVEL_BINS))
    padded = np.pad(table, ((0, 0), (width, width)), constant_values=-np.inf)
    banded: FloatArray = sliding_window_view(padded, 2 * width + 1, axis=1).max(axis=2)
    return banded, table.max(axis=1, keepdims=True)


def node_live_line(live: LiveLineSettings, colocation: ColocationSettings, step_seconds: int) -> LiveLineForecaster:
    """The (unfitted) learned live line of a node's pooled high-priority usage: the containers' model and settings,
    at the node room's risk level and horizon (one update: the room is re-issued every pass)."""
    model = LiveLineForecaster.from_settings(live, colocation.live_line_target_violation, step_seconds)
    # The fleet's factor alone, at its own rate: a node's room knobs were chosen with it, and a node's own misses are
    # what its margin and the rise tables answer for.
    result: LiveLineForecaster = model.set_params(
        horizon_seconds=colocation.live_line_horizon_seconds,
        fleet_adaptation_rate=colocation.live_line_fleet_adaptation_rate,
        own_adaptation_rate=0.0,
        own_sink_rate=0.0,
        # The node room already reserves the newest usage plus its rise.
        floor_at_last_step=False,
    )
    return result


def live_rise_reference(grid: FloatArray, limit: float | None) -> float:
    """The level a node's live rise table is binned over: its pods' requests (what fills a node), else its largest
    pooled usage in `grid` (1 x steps), else 1 (nothing known; a NaN limit is none)."""
    if limit is not None and limit > 0:
        return limit
    peak = float(np.nanmax(grid)) if np.any(~np.isnan(grid)) else 0.0
    return peak if peak > 0 else 1.0


INSTANCE_KEYS = ["namespace", "pod", "container", "node"]


@dataclass(frozen=True)
class PodContainers:
    """The pod containers on nodes of a frame of high-priority rows, as integer codes: the pooling is array work on
    them (a factorization per key column, no groupby over string columns). Codes number the containers in the order
    of their first row, as a `groupby(sort=False)` would; rows with a missing key are of none (code -1)."""

    codes: IntArray  # per row: its pod container, -1 for none
    first_rows: IntArray  # per pod container: its first row
    node: IntArray  # per pod container: its node's position in `nodes`
    nodes: list[str]  # sorted

    @classmethod
    def of(cls, usage: pd.DataFrame) -> PodContainers:
        codes = np.zeros(len(usage), dtype=np.int64)
        missing = np.zeros(len(usage), dtype=bool)
        for key in INSTANCE_KEYS:
            key_codes, uniques = factorize_labels(usage[key])
            missing |= key_codes < 0
            # Refactorized at each key, so the combined code stays below the row count (never overflows).
            codes = pd.factorize(codes * len(uniques) + key_codes)[0].astype(np.int64)
        if missing.any():
            codes[~missing] = pd.factorize(codes[~missing])[0]
            codes[missing] = -1
        # Codes appear in increasing order, so a container's first row is where the running maximum rises.
        first_rows = np.flatnonzero(np.diff(np.maximum.accumulate(codes), prepend=-1) > 0)
        names = usage["node"].iloc[first_rows].astype(str)
        nodes = sorted(names.unique())
        node = pd.Index(nodes).get_indexer(names).astype(np.int64)
        return cls(codes, first_rows, node, nodes)

    def instances(self, usage: pd.DataFrame) -> pd.DataFrame:
        """Per pod container (namespace, pod, container, node), in the order of its first sample: workload, priority
        class, first and last sample and its last request (or limit). "Last" is the newest row with a value of
        that column (as `groupby().last()` on rows in time order: of equal times, the later row)."""
        placed = np.flatnonzero(self.codes >= 0)
        timestamps = usage["timestamp"].to_numpy()
        # By container, then time; np.lexsort is stable, so rows of equal time keep their order.
        order = placed[np.lexsort((timestamps[placed], self.codes[placed]))]
        codes = self.codes[order]
        starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
        ends = np.r_[starts[1:], len(codes)] - 1
        n = len(self.first_rows)

        def last(column: str) -> pd.Series:
            values = usage[column]
            known = np.flatnonzero(values.notna().to_numpy()[order])
            newest = known[np.diff(codes[known], append=n) != 0]
            found: pd.Series = values.iloc[order[newest]].set_axis(codes[newest]).reindex(pd.RangeIndex(n))
            # A categorical's values (one per container: few) as plain ones, to be filled and compared as names.
            return found.astype(object) if isinstance(found.dtype, pd.CategoricalDtype) else found

        out = pd.DataFrame(
            {
                "workload": last("workload").astype(str),
                "priority_class": last("priority_class").fillna("none").astype(str)
                if "priority_class" in usage
                else "none",
                "last_sample": timestamps[order[ends]].astype(np.int64),
                "first_sample": timestamps[order[starts]].astype(np.int64),
            }
        )
        missing = pd.Series(np.nan, index=out.index)
        for resource, (_, request, limit) in RESOURCE_COLUMNS.items():
            asked = last(request) if request in usage else missing
            out[f"{resource}_request"] = asked.fillna(last(limit) if limit in usage else missing)
        # Ordered as a groupby over the rows sorted by time orders them: by first sample, then by that row.
        by_first = np.lexsort((order[starts], out["first_sample"].to_numpy()))
        out.index = pd.MultiIndex.from_frame(usage[INSTANCE_KEYS].iloc[self.first_rows].reset_index(drop=True))
        return out.iloc[by_first]


class NodeForecaster(BaseEstimator):  # type: ignore[misc]
    """Pooled high-priority usage per node and its short-term (per step) and long-term (steady) forecasts.

    Fitted: `nodes_` (names), `cpu_grid_`/`memory_grid_` (nodes x steps ending at `grid_end_`), the forecast models,
    `instances_` (one row per pod container on a node: last sample, last request or limit, priority class),
    `cpu_live_line_`/`memory_live_line_` (the learned node live line, `live_line` fitted on the grid; None when off or
    the history is too short), which the live loop issues every pass (`pipelines.live.NodeLiveLines`).
    """

    def __init__(
        self,
        forecast: FleetForecaster | None = None,
        step_seconds: int = 300,
        alive_seconds: int = 3600,
        cpu_jump_quantile: float = 0.99,
        memory_jump_quantile: float = 1.0,
        live_rise_band_fraction: float = 0.2,
        cpu_live_rise_history_days: int = 14,
        memory_live_rise_history_days: int = 7,
        live_rise_activity_seconds: int = 1800,
        live_line: LiveLineForecaster | None = None,
    ) -> None:
        self.forecast = forecast
        self.step_seconds = step_seconds
        self.alive_seconds = alive_seconds
        self.cpu_jump_quantile = cpu_jump_quantile
        self.memory_jump_quantile = memory_jump_quantile
        self.live_rise_band_fraction = live_rise_band_fraction
        self.cpu_live_rise_history_days = cpu_live_rise_history_days
        self.memory_live_rise_history_days = memory_live_rise_history_days
        self.live_rise_activity_seconds = live_rise_activity_seconds
        self.live_line = live_line

    @classmethod
    def from_settings(cls, settings: ModelSettings, colocation: ColocationSettings) -> NodeForecaster:
        """The node model of these settings: the workloads' forecast parameters and step, Koordinator's rise rules."""
        return cls(
            FleetForecaster.from_settings(settings.forecast),
            step_seconds=settings.reservation.step_seconds,
            cpu_jump_quantile=colocation.cpu_jump_quantile,
            memory_jump_quantile=colocation.memory_jump_quantile,
            live_rise_band_fraction=colocation.live_rise_band_fraction,
            cpu_live_rise_history_days=colocation.cpu_live_rise_history_days,
            memory_live_rise_history_days=colocation.memory_live_rise_history_days,
            live_rise_activity_seconds=colocation.live_rise_activity_seconds,
            live_line=(
                node_live_line(settings.live_line, colocation, settings.reservation.step_seconds)
                if colocation.live_line and settings.live_line.enabled
                else None
            ),
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A model pickled before a parameter existed gets its default (the live rise table's, issue 18).
        defaults = {name: p.default for name, p in inspect.signature(type(self).__init__).parameters.items()}
        state = {**{k: v for k, v in defaults.items() if k != "self"}, **state}
        super().__setstate__(migrate_node_state(state, FleetForecaster.from_settings))

    def _forecaster(self) -> FleetForecaster:
        return self.forecast if self.forecast is not None else FleetForecaster()

    def activity_steps(self) -> int:
        """The steps `live_rise_activity_seconds` spans (0: the live rise table is not split by activity)."""
        return int(self.live_rise_activity_seconds // self.step_seconds)

    def _activity_split(
        self, grid: FloatArray, reference: FloatArray, band_fraction: float, steps: int, whole: FloatArray
    ) -> dict[str, Any]:
        """One node's `activity_rise_tables` as its lines' fields (none without the split)."""
        if not self.activity_steps():
            return {}
        calm, active, edge = activity_rise_tables(grid, reference, band_fraction, steps, self.activity_steps(), whole)
        return {
            "live_rise_calm": calm[0].tolist(),
            "live_rise_active": active[0].tolist(),
            "live_activity_edge": float(edge[0]) if np.isfinite(edge[0]) else None,
        }

    def _steps(self) -> int:
        forecaster = self._forecaster()
        return (forecaster.selection_days + forecaster.history_days + 1) * (SECONDS_PER_DAY // self.step_seconds)

    def pool(self, X: pd.DataFrame, data_end: int | None = None) -> PooledNodeUsage | None:
        """The pooled usage of X's high-priority pods on nodes (None when it has none), on a grid ending at the step
        after `data_end`: the fleet's newest such sample when X is one partition of the fleet (`last_node_sample`
        of every partition's rows), X's own by default. A fitted model pools only samples from its grid end on, as
        `partial_fit` takes them. Partitions' pools add up (`PooledNodeUsage.merge`) to the whole fleet's."""
        require_columns(X, (*USAGE_COLUMNS, "node"), type(self).__name__)
        usage = high_priority_rows(X)
        if hasattr(self, "grid_end_"):
            usage = usage[usage["timestamp"] >= self.grid_end_]
        if usage.empty:
            return None
        end = int(usage["timestamp"].max()) if data_end is None else int(data_end)
        grid_end = (end // self.step_seconds + 1) * self.step_seconds
        containers = PodContainers.of(usage)
        if not containers.nodes:  # every row misses a key: no pod container to pool
            return None
        times = usage["timestamp"].to_numpy(dtype=np.float64)
        sums, observed = {}, {}
        for resource, (column, _, _) in RESOURCE_COLUMNS.items():
            sums[resource], observed[resource] = node_sums(
                containers.codes,
                containers.node,
                times,
                usage[column].to_numpy(dtype=np.float64),
                len(containers.node),
                len(containers.nodes),
                grid_end,
                self._steps(),
                self.step_seconds,
            )
        return PooledNodeUsage(
            containers.nodes, end, grid_end, sums, observed, containers.instances(usage), self.step_seconds
        )

    def fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        pooled = self.pool(X)
        if pooled is None:
            raise ValueError("no usage rows of high-priority pods with a node")
        return self.fit_pooled(pooled)

    def fit_pooled(self, pooled: PooledNodeUsage) -> Self:
        """Fit on pooled node usage (one frame's `pool`, or the merged pools of a fleet's partitions)."""
        self.nodes_ = np.asarray(pooled.nodes, dtype=str)
        self.data_end_ = pooled.data_end
        self.grid_end_ = pooled.grid_end
        self.instances_ = pooled.instances
        self.cpu_grid_, self.memory_grid_ = (pooled.grid(r) for r in ("cpu", "memory"))
        return self._fit_forecasts()

    def partial_fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        """Continue with samples newer than those seen: the pooled grids slide to the new end and take the new steps
        (samples inside the last seen step are not added twice), then the forecasts are refitted."""
        if not hasattr(self, "nodes_"):
            return self.fit(X)
        pooled = self.pool(X)
        return self if pooled is None else self.partial_fit_pooled(pooled)

    def partial_fit_pooled(self, pooled: PooledNodeUsage) -> Self:
        """`partial_fit` on pooled node usage (from this model's `pool` of the newer samples)."""
        check_is_fitted(self, "grid_end_")
        nodes = pd.Index(self.nodes_).append(pd.Index(pooled.nodes)).unique()
        shift = int((pooled.grid_end - self.grid_end_) // self.step_seconds)
        for name, resource in (("cpu_grid_", "cpu"), ("memory_grid_", "memory")):
            old = getattr(self, name)
            slid = np.full((len(nodes), old.shape[1]), np.nan)
            if shift < old.shape[1]:
                slid[: old.shape[0], : old.shape[1] - shift] = old[:, shift:]
            new = np.full_like(slid, np.nan)
            new[nodes.get_indexer(pd.Index(pooled.nodes))] = pooled.grid(resource)
            setattr(self, name, np.fmax(slid, new))
        merged = pd.concat([self.instances_, pooled.instances])
        self.instances_ = merged[~merged.index.duplicated(keep="last")]
        self.nodes_ = np.asarray(nodes, dtype=str)
        self.data_end_ = max(self.data_end_, pooled.data_end)
        self.grid_end_ = pooled.grid_end
        return self._fit_forecasts()

    def _fit_forecasts(self) -> Self:
        forecaster = self._forecaster()
        self.cpu_forecast_ = clone(forecaster).fit(self.cpu_grid_, grid_end=self.grid_end_).forecast_
        self.memory_forecast_ = clone(forecaster).fit(self.memory_grid_, grid_end=self.grid_end_).forecast_
        for resource in ("cpu", "memory"):
            setattr(self, f"{resource}_live_line_", self._fit_live_line(getattr(self, f"{resource}_grid_")))
        return self

    def _fit_live_line(self, grid: FloatArray) -> LiveLineForecaster | None:
        """The node live line fitted on the nodes' pooled grid as one fleet (None: off, or too little history: the
        live room keeps the rise tables alone)."""
        if self.live_line is None:
            return None
        try:
            fitted: LiveLineForecaster = clone(self.live_line).fit(grid, grid_end=self.grid_end_)
        except ValueError:
            return None
        return fitted

    def fitted_live_line(self, resource: str) -> LiveLineForecaster | None:
        """The fitted node live line of a resource (None: off, too little history, or a model fitted before it)."""
        found: LiveLineForecaster | None = getattr(self, f"{resource}_live_line_", None)
        return found

    def predict(self, as_of: int | None = None, horizon_seconds: int = SECONDS_PER_DAY) -> list[NodeForecast]:
        """Each node's pooled lines at `as_of` (default: data end); pods count toward `limit` while alive then."""
        check_is_fitted(self, "cpu_forecast_")
        decision = int(self.data_end_ + 1 if as_of is None else as_of)
        steps_per_day = SECONDS_PER_DAY // self.step_seconds
        lines = {
            "cpu": (self.cpu_grid_, self.cpu_forecast_.lines(decision, horizon_seconds, self.step_seconds)),
            "memory": (self.memory_grid_, self.memory_forecast_.lines(decision, horizon_seconds, self.step_seconds)),
        }
        instances = self.instances_.reset_index()
        out = []
        for row, name in enumerate(self.nodes_):
            mine = instances[instances["node"] == name]
            last_sample = int(mine["last_sample"].max())
            alive = mine[mine["last_sample"] >= last_sample - self.alive_seconds]
            per_resource: dict[str, NodeResourceLines | None] = {}
            for resource, (grid, (short, _, long)) in lines.items():
                recent = grid[row, -steps_per_day:]
                known = recent[~np.isnan(recent)]
                requests = alive[f"{resource}_request"]
                limit = float(requests.sum()) if requests.notna().any() else None
                reference = live_rise_reference(grid[row : row + 1], limit)
                rise_days = getattr(self, f"{resource}_live_rise_history_days")
                rise_args = (grid[row : row + 1], np.array([reference]), self.live_rise_band_fraction)
                whole = level_rise_table(*rise_args, rise_days * steps_per_day)
                split = self._activity_split(*rise_args, rise_days * steps_per_day, whole)
                per_resource[resource] = (
                    None
                    if np.all(np.isnan(short[row]))
                    else NodeResourceLines(
                        limit=limit,
                        last_usage=float(known[-1]) if known.size else None,
                        jump=float(
                            rise_allowance(
                                grid[row : row + 1], getattr(self, f"{resource}_jump_quantile"), 7 * steps_per_day
                            )[0]
                        ),
                        largest_jump=float(rise_allowance(grid[row : row + 1], 1.0, 7 * steps_per_day)[0]),
                        live_rise=whole[0].tolist(),
                        live_rise_reference=reference,
                        **split,
                        recent_usage=[None if np.isnan(v) else float(v) for v in recent],
                        short_term=np.nan_to_num(short[row]).tolist(),
                        long_term=float(np.nan_to_num(long[row])),
                    )
                )
            pods = alive.drop_duplicates(["namespace", "pod"])
            out.append(
                NodeForecast(
                    node=str(name),
                    last_sample=last_sample,
                    cpu=per_resource["cpu"],
                    memory=per_resource["memory"],
                    pods=[
                        NodePod(namespace=p.namespace, pod=p.pod, workload=p.workload, priority_class=p.priority_class)
                        for p in pods.itertuples()
                    ],
                )
            )
        return out
