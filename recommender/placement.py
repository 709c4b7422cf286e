"""Hotspot-aware placement on forecast load: the pure computation behind the scheduler extender.

Each node's load line is the forecast of its pods' pooled usage where the model learned the node (pods placed since
add their own lines), else the sum over the pods placed on it of their short-term reservation lines (their request
where we have learned nothing). For a candidate pod, a node's forecast peak is the maximum over the next
`window_seconds` of (node line + the pod's own line). A node fails when that peak crosses its thresholds (Koordinator
LoadAwareScheduling's 65 % CPU / 95 % memory, per-node annotation override); the score is Koordinator's leastUsed
on the forecast peak, averaged over CPU and memory and scaled to the extender's 0..10. Because the peak is taken
over time, two pods whose spikes come at different hours land together and two with the same hour do not.

Lines are 24 h long; a time past the horizon wraps around by time of day, so a model a few days old still places
daily spikes where they recur. Everything is a (nodes x steps) numpy matrix built once per change of pods, nodes or
model version, so a call over 5,000 nodes is a gather and a max.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from recommender import colocation, koordinator
from recommender.identity import WorkloadKey
from recommender.owners import workload_candidates
from recommender.resources import NodeForecast, NodePod, NodeResourceLines, WorkloadRecommendation
from recommender.settings import ColocationSettings, PlacementSettings
from recommender.units import cpu_cores_from_quantity, memory_bytes_from_quantity

Lookup = Callable[[WorkloadKey], WorkloadRecommendation | None]
Matrix = npt.NDArray[np.float64]
#: Candidate names (strings only) and their columns in the loads, as `NodeLoads.columns` gives them.
Columns = tuple[Sequence[str], npt.NDArray[np.int64]]
MAX_EXTENDER_SCORE = 10


@dataclass(frozen=True)
class Timeline:
    """Where the lines start and how they are stepped (from the loaded model version)."""

    as_of: int
    step_seconds: int
    steps: int

    def _first_and_count(self, now: float, window_seconds: int) -> tuple[int, int]:
        """The step `now` falls in (wrapped into the lines) and how many steps the window spans."""
        first = int((now - self.as_of) // self.step_seconds) % self.steps
        return first, max(1, -(-window_seconds // self.step_seconds))

    def window(self, now: float, window_seconds: int) -> npt.NDArray[np.int64]:
        """Indices of the steps from `now` over the window, wrapping by time of day past the end of the lines."""
        first, count = self._first_and_count(now, window_seconds)
        return (first + np.arange(count)) % self.steps

    def spans(self, now: float, window_seconds: int) -> list[tuple[int, int]]:
        """The steps of `window` as at most two (start, stop) ranges of the lines, so that a call reads them as
        slices (views) rather than copies; a window as long as the lines is all of them."""
        first, count = self._first_and_count(now, window_seconds)
        if count >= self.steps:
            return [(0, self.steps)]
        stop = first + count
        return [(first, stop)] if stop <= self.steps else [(first, self.steps), (0, stop - self.steps)]


@dataclass(frozen=True)
class NodeCapacity:
    cpu_cores: float
    memory_bytes: float
    cpu_threshold_percent: float
    memory_threshold_percent: float


def node_capacity(node: Mapping[str, Any], settings: PlacementSettings) -> NodeCapacity | None:
    """Allocatable and thresholds of a v1.Node; None when it says no allocatable CPU or memory."""
    try:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        cpu = cpu_cores_from_quantity(allocatable["cpu"])
        memory = memory_bytes_from_quantity(allocatable["memory"])
    except (KeyError, ValueError, TypeError, ArithmeticError):
        return None
    if not (cpu > 0 and memory > 0):
        return None
    annotations = (node.get("metadata") or {}).get("annotations")
    cpu_pct, memory_pct = koordinator.usage_thresholds(
        annotations, settings.cpu_threshold_percent, settings.memory_threshold_percent
    )
    return NodeCapacity(cpu, memory, cpu_pct, memory_pct)


def _requested(container: Mapping[str, Any], name: str) -> float | None:
    resources = container.get("resources") or {}
    for part in ("requests", "limits"):
        value = (resources.get(part) or {}).get(name)
        if value is not None:
            return cpu_cores_from_quantity(value) if name == "cpu" else memory_bytes_from_quantity(value)
    return None


def _running_containers(pod: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """Containers that run alongside each other: regular ones and sidecars (init containers that keep running)."""
    for field, _, container in koordinator.all_containers(pod):
        if field == "containers" or container.get("restartPolicy") == "Always":
            yield container


def pod_lines(
    pod: Mapping[str, Any], lookup: Lookup, timeline: Timeline, settings: PlacementSettings
) -> tuple[Matrix, Matrix, bool]:
    """(cpu cores, memory bytes, whether anything was learned) lines of one pod: learned short-term lines, else its
    request, else the defaults."""
    known = False
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    cpu, memory = np.zeros(timeline.steps), np.zeros(timeline.steps)
    containers = list(_running_containers(pod))
    workloads = workload_candidates(pod)
    for container in containers:
        name = str(container.get("name"))
        rec = next((r for w in workloads if (r := lookup(WorkloadKey(namespace, w, name))) is not None), None)
        for line, resource, default in (
            (cpu, "cpu", settings.default_cpu_cores),
            (memory, "memory", settings.default_memory_bytes),
        ):
            learned = getattr(rec, resource) if rec is not None else None
            if learned is not None and len(learned.short_term) == timeline.steps:
                line += np.asarray(learned.short_term)
                known = True
            else:
                requested = _requested(container, resource)
                line += default if requested is None else requested
    if not containers:
        cpu += settings.default_cpu_cores
        memory += settings.default_memory_bytes
    return cpu, memory, known


@dataclass(frozen=True)
class PodTotals:
    """What one pod holds on its node: its identity, its requests (None where no container states one) and the sum
    of its containers' long-term reservations (request, else the default, where nothing was learned)."""

    pod: NodePod
    high_priority: bool
    request: dict[str, float | None]
    long_term: dict[str, float]


def pod_totals(pod: Mapping[str, Any], lookup: Lookup, settings: PlacementSettings) -> PodTotals:
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    workloads = workload_candidates(pod)
    priority = koordinator.priority_class(pod)
    request: dict[str, float | None] = {"cpu": None, "memory": None}
    long_term = {"cpu": 0.0, "memory": 0.0}
    for container in _running_containers(pod):
        rec = next(
            (r for w in workloads if (r := lookup(WorkloadKey(namespace, w, str(container.get("name"))))) is not None),
            None,
        )
        for resource, default in (("cpu", settings.default_cpu_cores), ("memory", settings.default_memory_bytes)):
            asked = _requested(container, resource)
            if asked is not None:
                request[resource] = (request[resource] or 0.0) + asked
            learned = getattr(rec, resource) if rec is not None else None
            long_term[resource] += learned.long_term if learned is not None else (default if asked is None else asked)
    identity = NodePod(
        namespace=namespace,
        pod=str(meta.get("name") or ""),
        workload=workloads[0] if workloads else "",
        priority_class=priority,
    )
    return PodTotals(identity, priority not in koordinator.BORROWING_CLASSES, request, long_term)


@dataclass(frozen=True)
class NodeState:
    """What the colocation lines of one node are made of: its pods now, their high-priority requests and long-term
    reservations (the pooled forecast's where the model knows the node, plus pods placed since), and the forecast."""

    pods: list[NodePod]
    limit: dict[str, float | None]
    long_term: dict[str, float]
    forecast: NodeForecast | None


def _node_state(totals: list[PodTotals], forecast: NodeForecast | None) -> NodeState:
    known = {(p.namespace, p.pod) for p in forecast.pods} if forecast is not None else set()
    limit: dict[str, float | None] = {}
    long_term: dict[str, float] = {}
    for resource in ("cpu", "memory"):
        pooled = getattr(forecast, resource) if forecast is not None else None
        stated = [t.request[resource] for t in totals if t.high_priority and t.request[resource] is not None]
        limit[resource] = (
            sum(v for v in stated if v is not None) if stated else (pooled.limit if pooled is not None else None)
        )
        extra = [
            t.long_term[resource]
            for t in totals
            if t.high_priority and (pooled is None or (t.pod.namespace, t.pod.pod) not in known)
        ]
        long_term[resource] = (pooled.long_term if pooled is not None else 0.0) + sum(extra)
    return NodeState([t.pod for t in totals], limit, long_term, forecast)


@dataclass(frozen=True)
class NodeLoads:
    """Forecast load lines and capacity of every node we know, as matrices (one row per node).

    The load matrices are (steps x nodes + 1), float32, so that a call reads a window of contiguous rows and
    gathers its candidates' columns; the last column is all zeros and stands for any node not in `index`.
    Capacity rows of nodes without a known allocatable are NaN.
    """

    timeline: Timeline
    index: dict[str, int]
    cpu_cores: npt.NDArray[np.float32]
    memory_bytes: npt.NDArray[np.float32]
    capacity: dict[str, NodeCapacity]
    #: (rows x 4): cpu cores, memory bytes, cpu threshold %, memory threshold %
    capacity_matrix: Matrix
    states: dict[str, NodeState]
    #: the same as cpu_cores / memory_bytes over high-priority pods only: the short-term reservations
    hp_cpu_cores: npt.NDArray[np.float32]
    hp_memory_bytes: npt.NDArray[np.float32]

    @classmethod
    def build(
        cls,
        pods: Sequence[Mapping[str, Any]],
        nodes: Sequence[Mapping[str, Any]],
        lookup: Lookup,
        timeline: Timeline,
        settings: PlacementSettings,
        forecasts: Mapping[str, NodeForecast] | None = None,
    ) -> NodeLoads:
        """`forecasts`: the model's pooled node lines; a node's row starts from them and adds only pods not in them."""
        forecasts = forecasts or {}
        capacity = {}
        for node in nodes:
            found = node_capacity(node, settings)
            name = (node.get("metadata") or {}).get("name")
            if found is not None and isinstance(name, str):
                capacity[name] = found
        placed = [
            p
            for p in pods
            if (p.get("spec") or {}).get("nodeName")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        names = sorted(set(capacity) | {str(p["spec"]["nodeName"]) for p in placed} | set(forecasts))
        index = {name: i for i, name in enumerate(names)}
        # All pods (the extender's load) and the high-priority ones only (the reservations batch pods borrow below).
        cpu, memory, hp_cpu, hp_memory = (np.zeros((len(names) + 1, timeline.steps)) for _ in range(4))
        covered: set[tuple[str, str, str]] = set()
        for name, forecast in forecasts.items():
            for lines, pooled in (((cpu, hp_cpu), forecast.cpu), ((memory, hp_memory), forecast.memory)):
                if pooled is not None and len(pooled.short_term) == timeline.steps:
                    for line in lines:
                        line[index[name]] += pooled.short_term
            covered |= {(name, p.namespace, p.pod) for p in forecast.pods}
        totals: dict[str, list[PodTotals]] = {name: [] for name in names}
        for pod in placed:
            node_name = str(pod["spec"]["nodeName"])
            row = index[node_name]
            meta = pod.get("metadata") or {}
            held = pod_totals(pod, lookup, settings)
            totals[node_name].append(held)
            if (node_name, str(meta.get("namespace") or ""), str(meta.get("name") or "")) in covered:
                continue
            pod_cpu, pod_memory, _ = pod_lines(pod, lookup, timeline, settings)
            cpu[row] += pod_cpu
            memory[row] += pod_memory
            if held.high_priority:
                hp_cpu[row] += pod_cpu
                hp_memory[row] += pod_memory
        matrix = np.full((len(names) + 1, 4), np.nan)
        for name, found in capacity.items():
            matrix[index[name]] = _capacity_row(found)
        columns = [np.ascontiguousarray(m.T, dtype=np.float32) for m in (cpu, memory, hp_cpu, hp_memory)]
        states = {name: _node_state(totals[name], forecasts.get(name)) for name in names}
        return cls(timeline, index, columns[0], columns[1], capacity, matrix, states, columns[2], columns[3])

    def columns(self, names: Sequence[object]) -> Columns:
        """The names that are strings (in call order; anything else is left out) and their columns, the all-zeros
        last one for names not in `index`. A call naming only our nodes, the scheduler's usual, is one lookup each."""
        named = cast(Sequence[str], names)  # until a lookup fails
        try:
            return named, np.fromiter(map(self.index.__getitem__, named), np.int64, len(named))
        except (KeyError, TypeError):  # a name we do not know, or a value that is no name
            kept = [name for name in names if isinstance(name, str)]
            missing = itertools.repeat(len(self.index))
            return kept, np.fromiter(map(self.index.get, kept, missing), np.int64, len(kept))

    def node_line(self, name: str, high_priority: bool = False) -> tuple[list[float], list[float]]:
        """(cpu cores, memory bytes) forecast load line of one known node (of its high-priority pods only)."""
        column = self.index[name]
        cpu, memory = (
            (self.hp_cpu_cores, self.hp_memory_bytes) if high_priority else (self.cpu_cores, self.memory_bytes)
        )
        return cpu[:, column].tolist(), memory[:, column].tolist()


@dataclass(frozen=True)
class Reclaimable:
    """Room one node offers to borrowing pods now, by our rule and, for comparison, by Koordinator's."""

    batch: float
    mid: float
    policy: str
    stale: bool
    koordinator: dict[str, float]


def node_reclaimable(
    loads: NodeLoads, name: str, resource: str, now: float, settings: ColocationSettings
) -> Reclaimable | None:
    """Our batch and mid allocatable of a known node (None without a known allocatable), and Koordinator's values.

    Batch leaves the high-priority pods the highest short-term reservation over the next `batch_window_seconds`;
    mid their long-term reservation; both at least the last measured usage plus the node's rise allowance while that
    measurement is fresh. While the live loop's measurement of the node (`live_level`) is fresh, both are instead
    `colocation.live_reclaimable` of it (the value the node backtest scores as ours_live; policy "live"), batch from
    the larger of the rise and the learned live line where the live loop issued one (`colocation.line_reclaimable`,
    ours_live_line). Without
    it the service measures usage only when it trains, so between trainings the forecast alone carries the offer,
    with the wider forecast-only margin. Stale: the forecast ran past its horizon (training
    stopped), and the values decay toward the request-based ones. Koordinator's values come from what the service
    knows: its usage policy on the node's last pooled usage (the live one while fresh, the requests where there is none), "request" for memory
    only (Koordinator has no CPU request policy), its mid rule with the node's requests and long-term line as one
    aggregate pod and as the pooled peak, capped by allocatable minus that usage, allocatable as capacity. Koordinator's batch is 0 once that
    usage is older than 15 minutes, as Koordinator does without fresh metrics.
    """
    capacity = loads.capacity.get(name)
    if capacity is None:
        return None
    allocatable = capacity.cpu_cores if resource == "cpu" else capacity.memory_bytes
    state = loads.states[name]
    pooled = getattr(state.forecast, resource) if state.forecast is not None else None
    column = loads.hp_cpu_cores if resource == "cpu" else loads.hp_memory_bytes
    ahead = loads.timeline.window(now, settings.batch_window_seconds)
    reservation = float(column[ahead, loads.index[name]].max())
    forecast = state.forecast
    age = now - forecast.last_sample if forecast is not None else float("inf")
    # The measurement floors the offer only while fresh; the forecast is trusted over its horizon, then decays.
    last = (
        pooled.last_usage
        if pooled is not None and pooled.last_usage is not None and age <= settings.fresh_seconds
        else float("nan")
    )
    beyond = (
        now - (loads.timeline.as_of + loads.timeline.steps * loads.timeline.step_seconds)
        if forecast is not None
        else float("inf")
    )
    weight = float(colocation.staleness_weight(beyond, 0, settings.stale_half_life_seconds))
    limit = state.limit[resource]
    requested = reservation if limit is None else limit
    mine = settings.of(resource)
    margin = allocatable * mine.margin_fraction
    blind = allocatable * mine.forecast_only_margin_fraction
    jump = pooled.jump if pooled is not None else 0.0
    batch = float(
        colocation.reclaimable(allocatable, margin, 0.0, 0.0, reservation, last, requested, jump, weight, blind)
    )
    mid = float(
        colocation.reclaimable(
            allocatable, margin, 0.0, 0.0, state.long_term[resource], last, requested, jump, weight, blind
        )
    )
    measured = pooled.last_usage if pooled is not None else None
    live = live_level(state.forecast, resource, now, settings)
    if live is not None and pooled is not None:
        # The live loop's fresh measurement: its level plus the rise possible before the next update from it, and
        # more while the node is climbing.
        climb = float("nan") if pooled.live_climb is None else pooled.live_climb
        rise = float(colocation.climbing_rise(live_rise(pooled, live[0]), climb, mine.live_climb_factor))
        cap = float(column[ahead[0], loads.index[name]]) if mine.live_forecast_cap else float("nan")
        long_cap = state.long_term[resource] if mine.live_forecast_cap else float("nan")
        live_margin = allocatable * mine.live_margin_fraction
        batch, mid = (
            float(colocation.live_reclaimable(allocatable, live_margin, 0.0, 0.0, live[0], rise, line))
            for line in (cap, long_cap)
        )
        if settings.live_line and pooled.live_line is not None:
            # The learned live line the live loop issued with this measurement: batch reserves the larger of it and
            # the rise (the node backtest's ours_live_line); mid keeps the rise tables' room.
            batch = float(
                colocation.line_reclaimable(
                    allocatable,
                    allocatable * mine.live_line_margin_fraction,
                    0.0,
                    0.0,
                    live[0],
                    rise,
                    mine.live_line_factor * pooled.live_line,
                )
            )
        measured, age = live[0], now - live[1]
    percent = mine.koordinator_reclaim_percent
    used = requested if measured is None else measured
    long_term = np.array([state.long_term[resource]])
    koordinator_values = {
        "usage": float(colocation.koordinator_batch(allocatable, percent, 0.0, 0.0, used, age)),
        "max_usage_request": float(
            colocation.koordinator_batch(allocatable, percent, 0.0, 0.0, max(used, requested), age)
        ),
        "mid": float(
            colocation.koordinator_mid(
                allocatable, np.array([requested]), long_term, np.array([np.inf]), long_term[0], used, age
            )
        ),
    }
    if resource == "memory":  # Koordinator's "request" policy exists for memory only
        koordinator_values["request"] = float(
            colocation.koordinator_batch(allocatable, percent, 0.0, 0.0, requested, age)
        )
    policy = "live" if live is not None else "forecast" if state.forecast is not None else "per-pod lines"
    return Reclaimable(batch, mid, policy, live is None and weight < 1.0, koordinator_values)


def live_rise(pooled: NodeResourceLines, level: float) -> float:
    """The rise the live room keeps above a measured `level`: the node's rise table at that level
    (`colocation.level_rise`), the calm or the active one by the node's `live_activity` where the live loop measured
    it; for a version stored before the table, the largest rise of the week (else `jump`)."""
    if pooled.live_rise is not None and pooled.live_rise_reference is not None:
        at, reference = np.array([[level]]), np.array([pooled.live_rise_reference])
        whole = np.asarray([pooled.live_rise], dtype=np.float64)
        if not (pooled.live_rise_calm and pooled.live_rise_active):
            return float(colocation.level_rise(whole, at, reference)[0, 0])
        tables = (whole, np.asarray([pooled.live_rise_calm]), np.asarray([pooled.live_rise_active]))
        unknown = float("nan")
        edge = pooled.live_activity_edge if pooled.live_activity_edge is not None else unknown
        activity = pooled.live_activity if pooled.live_activity is not None else unknown
        return float(colocation.activity_rise(tables, np.array([edge]), np.array([[activity]]), at, reference)[0, 0])
    return pooled.jump if pooled.largest_jump is None else pooled.largest_jump


def live_level(
    forecast: NodeForecast | None, resource: str, now: float, settings: ColocationSettings
) -> tuple[float, int] | None:
    """(usage, when) of the node's pooled high-priority usage from the live loop (`NodeResourceLines.live_usage`)
    while at most `fresh_seconds` old, else None (the forecast-only value is served)."""
    if forecast is None or forecast.live_sample is None:
        return None
    pooled = getattr(forecast, resource)
    if pooled is None or pooled.live_usage is None or now - forecast.live_sample > settings.fresh_seconds:
        return None
    return float(pooled.live_usage), forecast.live_sample


def node_metadata(
    loads: NodeLoads, node: Mapping[str, Any], now: float, settings: ColocationSettings, extender: PlacementSettings
) -> tuple[dict[str, str], dict[str, str]] | None:
    """The labels and annotations Koordinator already reads that we want on a node the model learned (None for others).

    `node.koordinator.sh/<resource>-reclaim-ratio`: the ratio making Koordinator's usage policy keep our headroom above
    its live usage (`colocation.reclaim_percent`, written by `colocation.reclaim_ratio_label` as text Koordinator's
    truncating parser reads as that very percent: the reclaim-ratio margin + the forecast's rise over the batch window, at
    least the node's largest 5-minute rise of the week). `scheduling.koordinator.sh/
    usage-thresholds`: its `usageThresholds` lowered by the rise the forecast expects over the extender's window,
    always from the operator's thresholds (their per-node value, else the configured default; never from the value
    written last time); other keys are kept. Beside it `koordinator.WRITTEN_THRESHOLDS_ANNOTATION` records what was
    written and the operator's values, so the extender (which adds the forecast peak itself) and the next pass use the
    operator's thresholds, not ours.
    """
    name = (node.get("metadata") or {}).get("name")
    state = loads.states.get(str(name))
    if state is None or state.forecast is None or name not in loads.capacity:
        return None
    status = node.get("status") or {}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    thresholds: dict[str, int] = {}
    window = loads.timeline.window(now, extender.window_seconds)
    given = (node.get("metadata") or {}).get("annotations") or {}
    operator = koordinator.operator_thresholds(given)
    for resource in ("cpu", "memory"):
        pooled = getattr(state.forecast, resource)
        if pooled is None:
            continue
        allocatable = (
            loads.capacity[str(name)].cpu_cores if resource == "cpu" else loads.capacity[str(name)].memory_bytes
        )
        parse = cpu_cores_from_quantity if resource == "cpu" else memory_bytes_from_quantity
        try:
            capacity = parse((status.get("capacity") or {})[resource])
        except (KeyError, ValueError, TypeError, ArithmeticError):
            capacity = allocatable
        column = loads.hp_cpu_cores if resource == "cpu" else loads.hp_memory_bytes
        line = column[:, loads.index[str(name)]]
        if settings.write_reclaim_ratios:
            ahead = loads.timeline.window(now, settings.batch_window_seconds)
            margin = allocatable * settings.of(resource).reclaim_ratio_margin_fraction
            jump = pooled.jump if pooled.largest_jump is None else pooled.largest_jump
            percent = colocation.reclaim_percent(capacity, margin, float(line[ahead].max() - line[ahead[0]]), jump)
            labels[colocation.NODE_RECLAIM_LABEL[resource]] = colocation.reclaim_ratio_label(int(percent))
        live = live_level(state.forecast, resource, now, settings)
        measured = pooled.last_usage if live is None else live[0]
        current = measured if measured is not None else (state.limit[resource] or 0.0)
        peak = float(line[window].max())
        default = operator.get(
            resource, extender.cpu_threshold_percent if resource == "cpu" else extender.memory_threshold_percent
        )
        thresholds[resource] = colocation.usage_threshold_percent(
            allocatable, default, current, peak, settings.usage_threshold_floor_percent
        )
    if settings.write_usage_thresholds and thresholds:
        existing = koordinator.json_object(given.get(koordinator.USAGE_THRESHOLDS_ANNOTATION))
        stated = existing.get("usageThresholds")
        kept = stated if isinstance(stated, dict) else {}
        merged = {**existing, "usageThresholds": {**kept, **thresholds}}
        record = {"written": thresholds, "operator": {r: v for r, v in operator.items() if r in thresholds}}
        for key, value in (
            (koordinator.USAGE_THRESHOLDS_ANNOTATION, merged),
            (koordinator.WRITTEN_THRESHOLDS_ANNOTATION, record),
        ):
            annotations[key] = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return labels, annotations


def _capacity_row(capacity: NodeCapacity) -> tuple[float, float, float, float]:
    return capacity.cpu_cores, capacity.memory_bytes, capacity.cpu_threshold_percent, capacity.memory_threshold_percent


def _peak(
    load: npt.NDArray[np.float32], rows: npt.NDArray[np.int64], spans: list[tuple[int, int]], pod: Matrix
) -> Matrix:
    """Per candidate, the max over the window's `spans` of its node's load plus the pod's line (in float32).

    With many candidates every node's peak is taken over slices of the load (no copy), then the candidates' are
    picked; with few, their columns are gathered first, so a call costs what its candidates do.
    """
    gather = len(rows) * 4 < load.shape[1]
    peaks: npt.NDArray[np.float32] | None = None
    for start, stop in spans:
        part = np.take(load[start:stop], rows, axis=1) if gather else load[start:stop]
        top = (part + pod[start:stop, None].astype(np.float32)).max(axis=0)
        peaks = top if peaks is None else np.maximum(peaks, top)
    assert peaks is not None  # a window has at least one step
    found: Matrix = (peaks if gather else peaks[rows]).astype(np.float64)
    return found


@dataclass(frozen=True)
class Judgement:
    """Per candidate node (`nodes`, in call order): its column in the loads, whether its allocatable is known,
    forecast peaks in percent of allocatable, score 0-10, whether it fails; and the failures with why, by name."""

    nodes: Sequence[str]
    rows: npt.NDArray[np.int64]
    known: npt.NDArray[np.bool_]
    cpu_percent: Matrix
    memory_percent: Matrix
    scores: npt.NDArray[np.int64]
    fails: npt.NDArray[np.bool_]
    failed: dict[str, str]


def judge(
    loads: NodeLoads,
    pod: Mapping[str, Any],
    candidates: Sequence[object],
    given: Mapping[str, NodeCapacity],
    lookup: Lookup,
    settings: PlacementSettings,
    now: float,
    columns: Columns | None = None,
) -> Judgement:
    """Filter and score every candidate node (names; anything else is left out); capacity from the call (`given`)
    wins over the node list we read. `columns`: `loads.columns(candidates)` where the caller has it already.

    Nodes without a known allocatable, and every node for a pod we have learned nothing about, pass and get the
    neutral score: we do not steer what we cannot forecast. Only the pod's own line is computed per call; the rest
    is array arithmetic over the loads built once per cluster view.
    """
    node_names, rows = loads.columns(candidates) if columns is None else columns
    pod_cpu, pod_memory, pod_known = pod_lines(pod, lookup, loads.timeline, settings)
    if not pod_known:
        return _neutral(node_names, rows, settings)
    spans = loads.timeline.spans(now, settings.window_seconds)
    capacity = np.take(loads.capacity_matrix, rows, axis=0)
    if given:
        for position, name in enumerate(node_names):
            if name in given:
                capacity[position] = _capacity_row(given[name])
    cpu_pct = _peak(loads.cpu_cores, rows, spans, pod_cpu) * 100 / capacity[:, 0]
    memory_pct = _peak(loads.memory_bytes, rows, spans, pod_memory) * 100 / capacity[:, 1]
    known = ~np.isnan(capacity[:, 0])
    least_used = (np.clip(100 - cpu_pct, 0, 100) + np.clip(100 - memory_pct, 0, 100)) / 2
    scores = np.where(known, np.rint(np.nan_to_num(least_used) * MAX_EXTENDER_SCORE / 100), settings.neutral_score)
    cpu_over, memory_over = known & (cpu_pct > capacity[:, 2]), known & (memory_pct > capacity[:, 3])
    fails = cpu_over | memory_over
    failed = {}
    for position in np.flatnonzero(fails).tolist():
        reasons = []
        if cpu_over[position]:
            reasons.append(f"forecast CPU peak {cpu_pct[position]:.0f}% of allocatable > {capacity[position, 2]:g}%")
        if memory_over[position]:
            reasons.append(
                f"forecast memory peak {memory_pct[position]:.0f}% of allocatable > {capacity[position, 3]:g}%"
            )
        failed[node_names[position]] = "; ".join(reasons)
    return Judgement(node_names, rows, known, cpu_pct, memory_pct, scores.astype(np.int64), fails, failed)


def neutral(
    loads: NodeLoads, candidates: Sequence[object], settings: PlacementSettings, columns: Columns | None = None
) -> Judgement:
    """Every node passes with the neutral score."""
    return _neutral(*(loads.columns(candidates) if columns is None else columns), settings)


def _neutral(node_names: Sequence[str], rows: npt.NDArray[np.int64], settings: PlacementSettings) -> Judgement:
    count = len(node_names)
    unknown = np.full(count, np.nan)
    none = np.zeros(count, dtype=np.bool_)
    scores = np.full(count, settings.neutral_score, dtype=np.int64)
    return Judgement(node_names, rows, none, unknown, unknown, scores, none, {})
