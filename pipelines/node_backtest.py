"""`recommender backtest --nodes`: reclaimed batch and mid room per node and over time, ours against Koordinator's rules.

Placement: the file's `node` column when it has one (allocatable: the given node size, or the sum of the node's
requests when larger); otherwise a seeded random packing, documented in `pack_pods`. High-priority usage of a node
is the sum over its pods of each pod's 5-minute max (every pod of the file is high priority: the file holds the
workloads whose room batch pods would borrow).

At every 5-minute step t of every decision day (00:00 UTC, once 7 days of history exist), each method offers batch
(and mid) room; the node's high-priority pods are left `allocatable - offered`. A violation is a step where their
measured usage exceeded that. Methods:
- ours: `recommender.colocation.reclaimable` with the day-ahead forecast of the node's pooled usage (the same
  selected and calibrated forecasters as the workload backtest, fitted on the node grid), its highest value over the
  next `batch_window_seconds`, and the last measured usage plus the node's rise allowance while that measurement is
  fresh (a stale one is dropped: the forecast, within its horizon, carries on with the forecast-only margin);
- ours_live: what the live loop serves, updated every step from the newest measured usage (a pod without metrics at
  its request, as Koordinator counts it): `colocation.live_reclaimable`, the measurement plus the rise the node's
  live rise table allows from that level (`models.nodes.level_rise_table`, learned at each decision from the days
  before it, as the daily training does), plus the resource's `live_climb_factor` times the climb into that
  measurement (`colocation.climbing_rise`), capped by the forecast where the settings say so; the forecast-only value
  while the measurement is stale;
- ours_live_line: the live loop's room from the node's learned live line (`models.live_line` fitted on the node
  grid, `models.nodes.node_live_line`): re-issued every step, the cadence of the live loop's passes on 5-minute data,
  from the measured usage before it, refitted on the data before the first decision day and weekly after
  (`LIVE_LINE_REFIT_DAYS`), calibrated online; `colocation.line_reclaimable` (allocatable minus the larger of the
  live level and the line times the resource's `live_line_factor`), the ours_live value where no line is issued or
  the measurement is stale;
- ours_forecast_only: the same as ours without any measurement after the decision, at the forecast-only margin
  (what `serve` offers between daily trainings, which see no live usage);
- koordinator_our_ratio: Koordinator's usage policy, on its own live usage, with the node's reclaim ratio set as
  `recommender sync --reclaim-ratios` sets it (`colocation.reclaim_percent`, its own margin, the node's largest rise
  of the week), credited with the percent Koordinator reads from the label text: what a Koordinator cluster gets;
- Koordinator batch with its "usage" and "maxUsageRequest" policies, and for memory "request" (its CPU has no request
  policy), at its default thresholds, from the last measured 5-minute values (reset once they are older than 15
  minutes);
- Koordinator mid as its source has it (`colocation.koordinator_mid`), recomputed every step (koordlet trains every
  minute; the 5-minute data changes once a step) from koordlet's decaying histograms (`koordinator_peaks`) of each
  pod and of the node's pooled priority usage, capped by capacity minus the node's last usage; during a metric gap
  the value of the last report is held, and reset once it is older than 15 minutes.
Two scenarios: complete metrics, and seeded metric outages (whole-node gaps) where staleness rules matter.
(The decay of `colocation.staleness_weight` applies once a forecast runs past its horizon, which a daily decision
never does; it is tested on hand-made cases.)
The decision days are split in time: the first half is where the margin settings were chosen, the second is held out.
For the three paths without our daily forecast's measurement floor (ours_forecast_only, koordinator_our_ratio,
ours_live; beside them ours_live_weekly_max, the live room's earlier form: the node's largest rise of the week at
every level, for the record) the margin is also swept (`MARGIN_GRID`, complete metrics): `NodeBacktestResult.chosen_margin` is the
smallest with at most the violations of Koordinator's usage policy on the validation days, the rule the settings'
defaults were chosen by. The comparison that replaces that rule (issue 38) is at equal violations
(`NodeBacktestResult.equal`): the node live line's factor (`LINE_FACTOR_GRID`) and Koordinator's usage threshold
(`USAGE_THRESHOLD_GRID`) are swept, each gives a room-against-violations curve per part, and the room is read at the
method's own violation count as served and at 0.1 % and 1 % of the part's node-steps (`best_within`: the best point
within the budget, no interpolation), for ours_live_line and ours_live. The fair comparison
(`NodeBacktestResult.fair`) tunes Koordinator's knob (usage threshold,
mid safety margin) on the validation days to at most each method's violations there and judges both on the
held-out days.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.base import clone

from models.ensemble import line_forecaster
from models.histogram import MAX_DECAY_EXPONENT, ExponentialBuckets
from models.live_line import LiveLineForecaster
from models.nodes import (
    activity_rise_tables,
    group_sums,
    level_rise_table,
    live_rise_reference,
    node_activity,
    node_live_line,
    rise_allowance,
)
from pipelines.backtest import RESOURCES, Fleet, daily_candidate_lines, load_fleet, selected_lines
from pipelines.ingest import SampleBounds
from pipelines.replay import ReplayPlan, learned_issues
from pipelines.settings import TrainingSettings
from recommender import colocation
from recommender.arrays import FloatArray, IntArray
from recommender.progress import Step, quiet
from recommender.settings import ResourceColocation

BATCH_METHODS = (
    "ours",
    "ours_live",
    "ours_live_line",
    "ours_forecast_only",
    "koordinator_our_ratio",
    "koordinator_usage",
    "koordinator_request",
    "koordinator_maxUsageRequest",
)
MID_METHODS = ("ours_mid", "koordinator_mid")
SCENARIOS = ("complete", "outages")
#: Margins (share of allocatable) swept for the two paths that run without our fresh measurement floor: the value
#: `serve` offers between trainings and the reclaim-ratio label; the settings' defaults are chosen from this sweep.
MARGIN_GRID = tuple(round(0.005 * i, 3) for i in range(61))
SWEEP_PARTS = ("validation", "held_out")
#: Factors on the node's learned live line swept, each with every margin of `MARGIN_GRID`, for its
#: room-against-violations curve (complete metrics).
LINE_FACTOR_GRID = tuple(round(0.1 * i, 1) for i in range(2, 13))
#: The node live line is refitted at the first decision day and every this many days after: the daily training
#: would refit it every day; weekly (which the issue allows) keeps the replay's fits to a few per resource.
LIVE_LINE_REFIT_DAYS = 7
#: Violation budgets of the equal-violation comparison besides our own count, shares of the part's node-steps.
VIOLATION_BUDGETS = (0.001, 0.01)

#: The stages `run_node_backtest` reports: reading, then per resource the node short- and long-term candidates,
#: Koordinator mid's replay and the node live line's replay per scenario.
NODE_STAGES = 1 + 3 * len(RESOURCES) + len(SCENARIOS) * len(RESOURCES)


@dataclass(frozen=True)
class Placement:
    """Which node each pod of the fleet ran on, and every node's allocatable per resource."""

    node_of_pod: IntArray
    names: list[str]
    allocatable: dict[str, FloatArray]
    rule: str


def pack_pods(
    requests: dict[str, FloatArray], node_size: dict[str, float], seed: int
) -> tuple[IntArray, dict[str, FloatArray]]:
    """First fit on a seeded random order: pods are shuffled with numpy's `default_rng(seed)`, each goes to the
    first node where its CPU and memory requests both still fit, and a new node is opened when none has room. A pod
    larger than a node gets a node of its own, sized to it. Returns the node of each pod and each node's allocatable."""
    order = np.random.default_rng(seed).permutation(len(requests["cpu"]))
    node_of = np.zeros(len(order), dtype=np.int64)
    free: list[dict[str, float]] = []
    sizes: list[dict[str, float]] = []
    for pod in order:
        need = {r: float(requests[r][pod]) for r in RESOURCES}
        target = next((i for i, room in enumerate(free) if all(need[r] <= room[r] + 1e-9 for r in RESOURCES)), None)
        if target is None:
            size = {r: max(node_size[r], need[r]) for r in RESOURCES}
            sizes.append(size)
            free.append(dict(size))
            target = len(free) - 1
        for r in RESOURCES:
            free[target][r] -= need[r]
        node_of[pod] = target
    return node_of, {r: np.array([s[r] for s in sizes]) for r in RESOURCES}


def pod_requests(fleet: Fleet) -> dict[str, FloatArray]:
    """Each fleet pod's largest request (its limit where no request is given, its peak usage where neither is)."""
    frame, codes = fleet.frame, fleet.pod_of_row
    out = {}
    for resource, column in RESOURCES.items():
        stated = frame.get(f"{resource}_request_{'cores' if resource == 'cpu' else 'bytes'}")
        limit = frame.get(f"{resource}_limit_{'cores' if resource == 'cpu' else 'bytes'}")
        values = pd.Series(np.nan, index=frame.index)
        for part in (stated, limit, frame[column]):
            if part is not None:
                values = values.fillna(part)
        requested = np.zeros(int(codes.max()) + 1)
        np.maximum.at(requested, codes, np.nan_to_num(values.to_numpy(dtype=np.float64)))
        out[resource] = requested
    return out


def placement(fleet: Fleet, node_size: dict[str, float], seed: int) -> Placement:
    """Real placement from the `node` column when present (a pod's most frequent node), else `pack_pods`."""
    requests = pod_requests(fleet)
    frame = fleet.frame
    if "node" in frame.columns and frame["node"].notna().any():
        nodes = frame["node"].fillna("<unknown>").astype(str)
        most = (
            pd.DataFrame({"pod": fleet.pod_of_row, "node": nodes})
            .groupby("pod")["node"]
            .agg(lambda s: s.value_counts().index[0])
        )
        names = sorted(most.unique())
        node_of = pd.Index(names).get_indexer(most.sort_index().to_numpy()).astype(np.int64)
        allocatable = {}
        for r in RESOURCES:
            summed = np.zeros(len(names))
            np.add.at(summed, node_of, requests[r])
            allocatable[r] = np.maximum(summed, node_size[r])
        return Placement(
            node_of, names, allocatable, "the file's node column; allocatable = max(node size, sum of requests)"
        )
    node_of, allocatable = pack_pods(requests, node_size, seed)
    names = [f"node-{i:02d}" for i in range(len(allocatable["cpu"]))]
    rule = (
        f"first fit of the pods in a random order (numpy default_rng({seed})) by CPU and memory requests (limits where no "
        f"request) onto nodes of {node_size['cpu']:g} cores and {node_size['memory'] / 2**30:g} GiB"
    )
    return Placement(node_of, names, allocatable, rule)


def node_sums(pod_values: FloatArray, node_of: IntArray, n_nodes: int) -> FloatArray:
    """(nodes x steps) sum over each node's pods; NaN where none of them has a value."""
    total, seen = group_sums(pod_values, node_of, n_nodes)
    result: FloatArray = np.where(seen, total, np.nan)
    return result


def outage_mask(
    n_nodes: int, n_steps: int, fraction: float, seed: int, min_steps: int = 6, max_steps: int = 24
) -> npt.NDArray[np.bool_]:
    """Seeded whole-node metric gaps of 30 min to 2 h (uniform) covering about `fraction` of all node-steps."""
    rng = np.random.default_rng(seed + 1)
    mask = np.zeros((n_nodes, n_steps), dtype=bool)
    per_node = int(round(fraction * n_steps / ((min_steps + max_steps) / 2)))
    for node in range(n_nodes):
        for _ in range(per_node):
            length = int(rng.integers(min_steps, max_steps + 1))
            start = int(rng.integers(0, max(n_steps - length, 1)))
            mask[node, start : start + length] = True
    return mask


def last_measured(values: FloatArray, measured: npt.NDArray[np.bool_]) -> tuple[FloatArray, FloatArray]:
    """For each step t: the value at the last measured step before t (NaN if none) and how many steps back it is."""
    n = values.shape[1]
    index = np.where(measured, np.arange(n)[None, :], -1)
    latest = np.maximum.accumulate(index, axis=1)
    before = np.concatenate([np.full((values.shape[0], 1), -1), latest[:, :-1]], axis=1)
    gathered = np.take_along_axis(values, np.maximum(before, 0), axis=1)
    age = np.where(before >= 0, np.arange(n)[None, :] - before, np.inf)
    return np.where(before >= 0, gathered, np.nan), age


def climbs(values: FloatArray, measured: npt.NDArray[np.bool_]) -> FloatArray:
    """Per step, how far `values` rose into it from the step before (negative: a fall); NaN unless both were
    `measured` (`models.nodes.measured_climb` of the live loop's measurements)."""
    change = np.diff(values, axis=1, prepend=np.nan)
    both = measured & np.concatenate([np.zeros((values.shape[0], 1), dtype=bool), measured[:, :-1]], axis=1)
    result: FloatArray = np.where(both, change, np.nan)
    return result


def forward_max(line: FloatArray, steps: int) -> FloatArray:
    """Per row, the max of the next `steps` values from each step on (fewer near the end)."""
    padded = np.concatenate([line, np.repeat(line[:, -1:], max(steps - 1, 0), axis=1)], axis=1)
    result: FloatArray = sliding_window_view(padded, max(steps, 1), axis=1).max(axis=2)
    return result


@dataclass
class Offered:
    """Room offered per method, (nodes x evaluated steps), and the usage it is judged against."""

    hp: FloatArray
    allocatable: FloatArray
    short_term: FloatArray
    long_term: FloatArray
    batch: dict[str, FloatArray] = field(default_factory=dict)


@dataclass(frozen=True)
class MethodSummary:
    reclaimed: float  # resource-hours offered
    reclaimed_share: float  # mean offered / allocatable
    violations: int  # node-steps with high-priority usage above what was left for it
    violation_rate: float
    zero_drops: int  # node-steps where the offer fell to 0 from above 0
    mean_change: float  # mean |offer(t) - offer(t-1)| / allocatable


def summarize(offered: Offered, method: str, columns: slice, step_seconds: int) -> MethodSummary:
    batch = offered.batch[method][:, columns]
    hp = offered.hp[:, columns]
    alloc = offered.allocatable[:, None]
    known = ~np.isnan(hp)
    violated = known & (hp > alloc - batch + 1e-9)
    zero = (batch[:, 1:] <= 0) & (batch[:, :-1] > 0)
    return MethodSummary(
        reclaimed=float(batch.sum() * step_seconds / 3600),
        reclaimed_share=float(np.mean(batch / alloc)),
        violations=int(violated.sum()),
        violation_rate=float(violated.sum() / max(known.sum(), 1)),
        zero_drops=int(zero.sum()),
        mean_change=float(np.mean(np.abs(np.diff(batch, axis=1)) / alloc)),
    )


def _summary_of(offers: Offered, batch: FloatArray, columns: slice, step_seconds: int) -> MethodSummary:
    """`summarize` of one candidate offer judged against `offers`' usage."""
    return summarize(
        Offered(offers.hp, offers.allocatable, offers.short_term, offers.long_term, {"candidate": batch}),
        "candidate",
        columns,
        step_seconds,
    )


#: (knob value, summary per part) for each swept value: a margin (share of allocatable, smallest first), or
#: Koordinator's usage threshold (percent).
Sweep = list[tuple[float, dict[str, MethodSummary]]]
#: (Koordinator's tuned knob value, its summary per part), or None when no swept value was as safe.
Tuned = tuple[float, dict[str, MethodSummary]] | None
Knob = TypeVar("Knob")
#: The node live line's knobs: the factor on the line and the margin (share of allocatable).
LineKnob = tuple[float, float]
#: A knob, as the report names it, and the summary it gave on one part.
Point = tuple[str, MethodSummary]


def sweep(
    offers: Offered,
    make: Callable[[Knob], FloatArray],
    grid: Sequence[Knob],
    parts: dict[str, slice],
    step_seconds: int,
) -> list[tuple[Knob, dict[str, MethodSummary]]]:
    """Each knob value's offer (`make`) judged on the validation and the held-out days."""
    return [
        (value, {part: _summary_of(offers, make(value), parts[part], step_seconds) for part in SWEEP_PARTS})
        for value in grid
    ]


def best_within(
    swept: Sequence[tuple[Knob, dict[str, MethodSummary]]], part: str, budget: int
) -> tuple[Knob, MethodSummary] | None:
    """The swept point with the most room on `part` among those with at most `budget` violations there (None: none
    is that safe): a room-against-violations curve read at a budget, with no interpolation between points, so the
    room it gives never grows as the budget shrinks. Several knobs swept together give their envelope."""
    within = [(value, found[part]) for value, found in swept if found[part].violations <= budget]
    return max(within, key=lambda point: point[1].reclaimed, default=None)


@dataclass(frozen=True)
class RoomAtBudget:
    """Ours and Koordinator's usage policy at one violation budget (node-steps) on one part."""

    budget: int
    ours: Point | None
    koordinator: Point | None

    @property
    def gain(self) -> float | None:
        """Our room over Koordinator's - 1; None when either has no point within the budget or Koordinator none."""
        if self.ours is None or self.koordinator is None or self.koordinator[1].reclaimed <= 0:
            return None
        return self.ours[1].reclaimed / self.koordinator[1].reclaimed - 1.0


@dataclass(frozen=True)
class EqualViolations:
    """A method's room against Koordinator's usage policy at equal violations on one part: at the violation count of
    the method as served (its knobs from the settings; Koordinator's threshold the best within that count), and at
    each of `VIOLATION_BUDGETS` of the part's node-steps (each side's best swept point within it). Koordinator's
    threshold is picked on the same days it is judged: the comparison is between the two curves, not a forecast of
    Koordinator's tuning."""

    node_steps: int
    served: str
    at: dict[str, RoomAtBudget]


def budget_name(share: float) -> str:
    return f"{share * 100:g} %"


def margin_name(fraction: float) -> str:
    return f"margin {fraction * 100:g} %"


def line_knob_name(knob: LineKnob) -> str:
    return f"factor {knob[0]:g}, margin {knob[1] * 100:g} %"


def equal_violations(
    ours: Sequence[tuple[Knob, dict[str, MethodSummary]]],
    served: tuple[Knob, MethodSummary],
    koordinator: Sweep,
    part: str,
    node_steps: int,
    name: Callable[[Knob], str],
) -> EqualViolations:
    """`EqualViolations` of a method's sweep (`served`: its knobs and summary as the settings serve them; `name`
    says a knob of ours as the report does)."""

    def named(point: tuple[Knob, MethodSummary] | None) -> Point | None:
        return None if point is None else (name(point[0]), point[1])

    def threshold(point: tuple[float, MethodSummary] | None) -> Point | None:
        return None if point is None else (f"threshold {point[0]:g} %", point[1])

    count = served[1].violations
    at = {"ours": RoomAtBudget(count, named(served), threshold(best_within(koordinator, part, count)))}
    for share in VIOLATION_BUDGETS:
        budget = int(share * node_steps)
        at[budget_name(share)] = RoomAtBudget(
            budget, named(best_within(ours, part, budget)), threshold(best_within(koordinator, part, budget))
        )
    return EqualViolations(node_steps, name(served[0]), at)


@dataclass(frozen=True)
class NodeBacktestResult:
    placement: Placement
    decision_days: list[int]
    first_step: int
    step_seconds: int
    origin: int
    offered: dict[str, dict[str, Offered]]  # scenario -> resource -> offers
    summaries: dict[str, dict[str, dict[str, dict[str, MethodSummary]]]]  # part -> scenario -> resource -> method
    sweeps: dict[str, dict[str, Sweep]]  # resource -> method -> its margin sweep (complete metrics)
    fair: dict[str, dict[str, Tuned]]  # resource -> method -> Koordinator tuned to its validation violations
    seconds: float
    #: resource -> the node live line's (factor, margin) sweep, and Koordinator's usage-threshold sweep (complete
    #: metrics)
    line_sweeps: dict[str, list[tuple[LineKnob, dict[str, MethodSummary]]]] = field(default_factory=dict)
    koordinator_sweeps: dict[str, Sweep] = field(default_factory=dict)
    #: resource -> method (ours_live_line, ours_live) -> part -> its room against Koordinator's at equal violations
    equal: dict[str, dict[str, dict[str, EqualViolations]]] = field(default_factory=dict)

    def chosen_margin(self, resource: str, method: str) -> float | None:
        """The smallest swept margin (most room) whose violations on the validation days are at most those of
        Koordinator's usage policy there; None when no swept margin is that safe."""
        bound = self.summaries["validation"]["complete"][resource]["koordinator_usage"].violations
        return next(
            (fraction for fraction, found in self.sweeps[resource][method] if found["validation"].violations <= bound),
            None,
        )

    def chosen_line_knobs(self, resource: str) -> LineKnob | None:
        """The node live line's (factor, margin) whose validation room is the largest share above Koordinator's usage
        policy at as many violations (its best threshold within that count), fewer violations on a tie: the rule
        the settings' live-line knobs are chosen by, the goal's own measure read on the validation days only. None
        when Koordinator has no point as safe as any of ours."""
        koordinator = self.koordinator_sweeps[resource]
        best: tuple[float, int, LineKnob] | None = None
        for knob, found in self.line_sweeps[resource]:
            ours = found["validation"]
            theirs = best_within(koordinator, "validation", ours.violations)
            if theirs is None or theirs[1].reclaimed <= 0:
                continue
            score = (round(ours.reclaimed / theirs[1].reclaimed, 4), -ours.violations, knob)
            best = score if best is None or score[:2] > best[:2] else best
        return None if best is None else best[2]


def _forecast_lines(
    grid: FloatArray, settings: TrainingSettings, decision_days: list[int], per_day: int, step: Step, resource: str
) -> tuple[FloatArray, FloatArray]:
    """Our day-ahead short-term lines (days x nodes x steps) and long-term values (days x nodes) on the node grid."""
    forecast = settings.forecast
    out = []
    for line in ("short_term", "long_term"):
        selector = line_forecaster(forecast, line)
        candidates = selector.candidate_models()
        step(f"{resource}: node {line.replace('_', '-')} candidates ({len(candidates)} models)")
        lines = daily_candidate_lines(grid, candidates, per_day, selector.constant)
        final, _ = selected_lines(grid, lines, selector, decision_days, per_day)
        out.append(final)
    return out[0], out[1][:, :, 0]


#: koordlet's histogram layouts (predict_server.go): 5 % wider buckets, CPU from 0.025 core to 1024 cores, memory from
#: 5 MiB to 2 TiB.
KOORDINATOR_BUCKETS = {
    "cpu": ExponentialBuckets(0.025, 1024.0, 0.05),
    "memory": ExponentialBuckets(5 * 2**20, float(2**41), 0.05),
}


def koordinator_peaks(values: FloatArray, resource: str, step_seconds: int, start: int, end: int) -> FloatArray:
    """koordlet's predicted peak of each row (a pod, or a node's pooled priority usage) at every step of [start, end):
    the p95 (CPU) / p98 (memory) of a decaying histogram (12 h / 24 h half-life) of the row's samples before that
    step, as its peak predictor reads it (the end of the bucket where the weight reaches the quantile); NaN before the
    first sample. One sample a step of weight 1: koordlet samples every minute, the same 5-minute value 5 times here,
    which leaves the quantiles unchanged. Buckets under VPA's epsilon (weights below 2^-100 of the newest) are kept."""
    layout = KOORDINATOR_BUCKETS[resource]
    quantile = colocation.KOORDINATOR_MID_QUANTILE[resource]
    half_life_steps = colocation.KOORDINATOR_MID_HALF_LIFE_SECONDS[resource] / step_seconds
    rows = np.arange(values.shape[0])
    has = ~np.isnan(values)
    buckets = layout.find(np.nan_to_num(values))
    ends = np.append(layout.starts[1:], layout.starts[-1])  # a bucket's end; the last bucket has none: its start
    weights = np.zeros((values.shape[0], layout.num_buckets))
    out = np.full((values.shape[0], end - start), np.nan)
    reference = 0
    for t in range(end):
        if t >= start:
            cumulative = np.cumsum(weights, axis=1)
            total = cumulative[:, -1]
            found = np.argmax(cumulative >= quantile * total[:, None], axis=1)
            out[:, t - start] = np.where(total > 0, ends[found], np.nan)
        exponent = (t - reference) / half_life_steps
        if exponent > MAX_DECAY_EXPONENT:  # re-base, as the decaying histogram does: quantiles are unchanged
            weights *= 2.0**-exponent
            reference, exponent = t, 0.0
        live = rows[has[:, t]]
        weights[live, buckets[live, t]] += 2.0**exponent
    return out


def _pods_by_node(node_of: IntArray, n_nodes: int) -> IntArray:
    """(nodes x most pods on a node) pod indices, -1 where a node has fewer."""
    width = max(int(np.bincount(node_of, minlength=n_nodes).max()), 1)
    table = np.full((n_nodes, width), -1, dtype=np.int64)
    for node in range(n_nodes):
        members = np.flatnonzero(node_of == node)
        table[node, : len(members)] = members
    return table


@dataclass(frozen=True)
class MidInputs:
    """What Koordinator's mid rule sees at every evaluated step, gathered per node (nodes x pods x steps) for
    `colocation.koordinator_mid`: requests (NaN: no pod), predicted peaks, ages; and per node its pooled peak and usage."""

    capacity: FloatArray
    request: FloatArray
    peak: FloatArray
    age_seconds: FloatArray
    pooled_peak: FloatArray
    node_usage: FloatArray

    def mid(self, metrics_age_seconds: FloatArray, safety_margin_percent: float) -> FloatArray:
        return colocation.koordinator_mid(
            self.capacity[:, None],
            self.request,
            self.peak,
            self.age_seconds,
            self.pooled_peak,
            self.node_usage,
            metrics_age_seconds,
            safety_margin_percent,
            axis=1,
        )


def koordinator_mid_inputs(
    pods: FloatArray,
    grid: FloatArray,
    requests: FloatArray,
    present: npt.NDArray[np.bool_],
    first_step: IntArray,
    node_of: IntArray,
    capacity: FloatArray,
    resource: str,
    step_seconds: int,
    start: int,
    end: int,
) -> MidInputs:
    """Koordinator's mid inputs at every step of [start, end), refreshed every step as koordlet (training every
    minute) and the slo-controller (on every NodeMetric report) do: per pod its peak and age, per node the pooled
    peak (the prod item's, plus the system and none items, whose samples here are all 0: each contributes its first
    bucket's end) and the last reported usage."""
    table = _pods_by_node(node_of, len(capacity))
    valid = table >= 0
    index = np.where(valid, table, 0)
    peaks = koordinator_peaks(pods, resource, step_seconds, start, end)
    pooled = koordinator_peaks(np.nan_to_num(grid), resource, step_seconds, start, end)
    empty_items = 2 * KOORDINATOR_BUCKETS[resource].starts[1]
    steps = np.arange(start, end)
    request = np.where(present[:, start:end], requests[:, None], np.nan)
    age: FloatArray = ((steps[None, :] - first_step[:, None]) * step_seconds).astype(np.float64)

    def gather(values: FloatArray) -> FloatArray:
        result: FloatArray = np.where(valid[:, :, None], values[index], np.nan)
        return result

    usage, _ = last_measured(np.nan_to_num(grid), np.ones(grid.shape, dtype=bool))
    return MidInputs(capacity, gather(request), gather(peaks), gather(age), pooled + empty_items, usage[:, start:end])


def reported(values: FloatArray, measured: npt.NDArray[np.bool_], start: int) -> FloatArray:
    """Per step t of `values` (computed at each step from the data before it), the one computed right after the last
    measured step before t: what a controller acting on the last report holds during a metric gap."""
    full = np.zeros((values.shape[0], start + values.shape[1] + 1))
    full[:, start : start + values.shape[1]] = values
    held, _ = last_measured(full[:, 1:], measured)
    result: FloatArray = np.nan_to_num(held)[:, start:]
    return result


def tuned_threshold(
    offers: Offered,
    make: Callable[[float], FloatArray],
    grid: Sequence[float],
    bound: int,
    parts: dict[str, slice],
    step_seconds: int,
) -> tuple[float, dict[str, MethodSummary]] | None:
    """The value of a Koordinator knob (from `grid`, most room first) whose validation violations are at most `bound`,
    with its summaries per part: Koordinator tuned to the violations of the method it is compared with."""
    for value in grid:
        found = {part: _summary_of(offers, make(value), parts[part], step_seconds) for part in SWEEP_PARTS}
        if found["validation"].violations <= bound:
            return value, found
    return None


def run_node_backtest(
    path: Path,
    settings: TrainingSettings,
    node_size: dict[str, float],
    seed: int = 0,
    outage_fraction: float = 0.02,
    step: Step = quiet,
) -> NodeBacktestResult:
    """The whole protocol on one usage file."""
    started = time.perf_counter()
    step(f"reading {path}")
    fleet = load_fleet(path, settings.reservation.step_seconds, SampleBounds.at(settings.ingest, time.time()))
    where = placement(fleet, node_size, seed)
    per_day, step_seconds = fleet.steps_per_day, fleet.step_seconds
    n_nodes = len(where.names)
    decision_days = list(range(7, fleet.days))
    start, end = decision_days[0] * per_day, fleet.days * per_day
    requests = pod_requests(fleet)
    col = settings.colocation
    known_any = ~np.isnan(fleet.pod_grid["cpu"]) | ~np.isnan(fleet.pod_grid["memory"])
    first_step = np.argmax(known_any, axis=1).astype(np.int64)
    last_step = (known_any.shape[1] - 1 - np.argmax(known_any[:, ::-1], axis=1)).astype(np.int64)
    steps = np.arange(known_any.shape[1])
    present = (steps[None, :] >= first_step[:, None]) & (steps[None, :] <= last_step[:, None])
    outages = outage_mask(n_nodes, end - start, outage_fraction, seed)
    offered: dict[str, dict[str, Offered]] = {s: {} for s in SCENARIOS}
    sweeps: dict[str, dict[str, Sweep]] = {}
    line_sweeps: dict[str, list[tuple[LineKnob, dict[str, MethodSummary]]]] = {}
    koordinator_sweeps: dict[str, Sweep] = {}
    fair: dict[str, dict[str, Tuned]] = {}
    half = len(decision_days) // 2 * per_day
    parts = {"all": slice(None), "validation": slice(0, half), "held_out": slice(half, None)}
    for resource in RESOURCES:
        pods = fleet.pod_grid[resource]
        grid = node_sums(pods, where.node_of_pod, n_nodes)
        short, long = _forecast_lines(grid, settings, decision_days, per_day, step, resource)
        short_flat = np.concatenate(list(short), axis=1)  # nodes x evaluated steps
        long_flat = np.repeat(long.T, per_day, axis=1)
        alloc = where.allocatable[resource]
        mine = col.of(resource)
        margin = mine.margin_fraction * alloc[:, None]
        blind_fraction = mine.forecast_only_margin_fraction
        blind_margin = blind_fraction * alloc[:, None]
        reclaim_percent = mine.koordinator_reclaim_percent
        request_now = np.where(present, requests[resource][:, None], np.nan)
        requested = node_sums(request_now, where.node_of_pod, n_nodes)
        limit = requested[:, start:end]
        policies = colocation.KOORDINATOR_RESOURCE_POLICIES[resource]
        hp_used = {
            policy: node_sums(
                np.where(
                    present, colocation.koordinator_hp_used(policy, pods[:, :, None], request_now[:, :, None]), np.nan
                ),
                where.node_of_pod,
                n_nodes,
            )
            for policy in policies
        }
        step(f"{resource}: Koordinator mid, every step (koordlet's histograms per pod and per node)")
        mid_inputs = koordinator_mid_inputs(
            pods,
            grid,
            requests[resource],
            present,
            first_step,
            where.node_of_pod,
            alloc,
            resource,
            step_seconds,
            start,
            end,
        )
        window = max(col.batch_window_seconds // step_seconds, 1)
        quantile = mine.jump_quantile
        jump, largest_jump = (
            np.concatenate(
                [
                    np.repeat(rise_allowance(grid[:, : day * per_day], q, 7 * per_day)[:, None], per_day, axis=1)
                    for day in decision_days
                ],
                axis=1,
            )
            for q in (quantile, 1.0)
        )
        activity_steps = col.live_rise_activity_seconds // step_seconds
        rise_tables = live_rise_tables(
            grid, requested, decision_days, per_day, col.live_rise_band_fraction, mine, activity_steps
        )
        activity = node_activity(grid, activity_steps) if activity_steps else None
        line_model = node_live_line(settings.live_line, col, step_seconds)
        # The nodes' high-priority usage that the live level and its climb read, the same in every scenario.
        measured_usage = np.nan_to_num(hp_used["usage"])
        for scenario in SCENARIOS:
            measured = np.ones((n_nodes, end - start), dtype=bool) if scenario == "complete" else ~outages
            full_measured = np.concatenate([np.ones((n_nodes, start), dtype=bool), measured], axis=1)
            last_usage, age_steps = last_measured(grid, full_measured)
            age = age_steps[:, start:end] * step_seconds
            # A stale measurement no longer floors the offer: the day-ahead forecast (within its horizon) carries on.
            last_usage = np.where(age <= col.fresh_seconds, last_usage[:, start:end], np.nan)
            # The offer at t holds for the batch window: it leaves room for the highest forecast over it.
            ahead = forward_max(short_flat, window)
            offers = Offered(hp=grid[:, start:end], allocatable=alloc, short_term=short_flat, long_term=long_flat)
            offers.batch["ours"] = colocation.reclaimable(
                alloc[:, None], margin, 0.0, 0.0, ahead, last_usage, limit, jump, unmeasured_margin=blind_margin
            )
            live, _ = last_measured(measured_usage, full_measured)

            def forecast_only(fraction: float) -> FloatArray:
                """What `serve` offers between trainings (no measurement after the decision) at this margin."""
                return colocation.reclaimable(alloc[:, None], fraction * alloc[:, None], 0.0, 0.0, ahead, np.nan, limit)

            def with_our_ratio(fraction: float) -> FloatArray:
                """Koordinator's usage policy on the node's live usage with the reclaim-ratio label our writer puts
                on the node at this margin (recomputed every step, as `sync` can), credited with the percent
                Koordinator reads from the label text: our headroom over its measurement."""
                written = colocation.reclaim_percent(
                    alloc[:, None], fraction * alloc[:, None], ahead - short_flat, largest_jump
                )
                applied = colocation.KOORDINATOR_READS[written.astype(np.int64)]
                return colocation.koordinator_batch(alloc[:, None], applied, 0.0, 0.0, live[:, start:end], age)

            # The live loop's level: the newest measured usage, a pod without metrics at its request (as Koordinator).
            live_level = np.where(age <= col.fresh_seconds, live[:, start:end], np.nan)
            cap = short_flat if mine.live_forecast_cap else np.nan
            # The activity known with the live level: up to the step it was measured at.
            live_activity = None if activity is None else last_measured(activity, full_measured)[0][:, start:end]
            # The climb into the newest measurement (where the step before it was measured too), as the live loop's.
            climb = last_measured(climbs(measured_usage, full_measured), full_measured)[0][:, start:end]
            live_rise = colocation.climbing_rise(
                rise_tables.rise(live_level, live_activity), climb, mine.live_climb_factor
            )

            def live_room(rise: FloatArray) -> Callable[[float], FloatArray]:
                def served(fraction: float) -> FloatArray:
                    """What the live loop serves, updated every step from the newest measurement (the forecast-only
                    value where that is stale): `colocation.live_reclaimable` with this rise above the level."""
                    value = colocation.live_reclaimable(
                        alloc[:, None], fraction * alloc[:, None], 0.0, 0.0, live_level, rise, cap
                    )
                    return np.where(np.isnan(value), offers.batch["ours_forecast_only"], value)

                return served

            served_live = live_room(live_rise)

            offers.batch["ours_forecast_only"] = forecast_only(blind_fraction)
            offers.batch["ours_live"] = served_live(mine.live_margin_fraction)
            step(f"{resource}: node live line, issued every step ({scenario} metrics)")
            node_line = node_live_lines(grid, full_measured, fleet.origin, start, end, line_model, step)

            def line_room(knob: LineKnob) -> FloatArray:
                """What the live loop serves from the node's learned live line and its rise tables at this factor
                and margin (the forecast-only value where the measurement is stale)."""
                factor, fraction = knob
                value = colocation.line_reclaimable(
                    alloc[:, None], fraction * alloc[:, None], 0.0, 0.0, live_level, live_rise, factor * node_line
                )
                return np.where(np.isnan(value), offers.batch["ours_forecast_only"], value)

            offers.batch["ours_live_line"] = line_room((mine.live_line_factor, mine.live_line_margin_fraction))
            offers.batch["koordinator_our_ratio"] = with_our_ratio(mine.reclaim_ratio_margin_fraction)
            paths = (
                ("ours_forecast_only", forecast_only),
                ("koordinator_our_ratio", with_our_ratio),
                ("ours_live", served_live),
                ("ours_live_weekly_max", live_room(largest_jump)),
            )
            if scenario == "complete":
                sweeps[resource] = {path: sweep(offers, make, MARGIN_GRID, parts, step_seconds) for path, make in paths}
                knobs = [(factor, fraction) for factor in LINE_FACTOR_GRID for fraction in MARGIN_GRID]
                line_sweeps[resource] = sweep(offers, line_room, knobs, parts, step_seconds)
                koordinator_sweeps[resource] = sweep(
                    offers, koordinator_usage(alloc, live[:, start:end], age), USAGE_THRESHOLD_GRID, parts, step_seconds
                )
            for policy in policies:
                used, _ = last_measured(np.nan_to_num(hp_used[policy]), full_measured)
                offers.batch[f"koordinator_{policy}"] = colocation.koordinator_batch(
                    alloc[:, None], reclaim_percent, 0.0, 0.0, used[:, start:end], age
                )
            offers.batch["ours_mid"] = colocation.reclaimable(
                alloc[:, None], margin, 0.0, 0.0, long_flat, last_usage, limit, jump, unmeasured_margin=blind_margin
            )

            def koordinator_mid(safety_margin_percent: float) -> FloatArray:
                """Koordinator's mid as the controller holds it: computed after each report, reset when stale."""
                computed = mid_inputs.mid(np.zeros_like(age), safety_margin_percent)
                return np.where(
                    age <= colocation.KOORDINATOR_DEGRADE_SECONDS, reported(computed, full_measured, start), 0.0
                )

            offers.batch["koordinator_mid"] = koordinator_mid(colocation.KOORDINATOR_MID_SAFETY_MARGIN_PERCENT)
            offered[scenario][resource] = offers
            if scenario == "complete":
                fair[resource] = _fair_comparisons(
                    offers, parts, step_seconds, alloc, live[:, start:end], age, koordinator_mid
                )
    summaries = {
        part: {
            scenario: {
                resource: {m: summarize(offers, m, columns, step_seconds) for m in offers.batch}
                for resource, offers in offered[scenario].items()
            }
            for scenario in SCENARIOS
        }
        for part, columns in parts.items()
    }
    equal: dict[str, dict[str, dict[str, EqualViolations]]] = {}
    for resource in RESOURCES:
        mine = col.of(resource)
        for part in SWEEP_PARTS:
            found = summaries[part]["complete"][resource]
            node_steps = int(np.sum(~np.isnan(offered["complete"][resource].hp[:, parts[part]])))
            equal.setdefault(resource, {}).setdefault("ours_live_line", {})[part] = equal_violations(
                line_sweeps[resource],
                ((mine.live_line_factor, mine.live_line_margin_fraction), found["ours_live_line"]),
                koordinator_sweeps[resource],
                part,
                node_steps,
                line_knob_name,
            )
            equal[resource].setdefault("ours_live", {})[part] = equal_violations(
                sweeps[resource]["ours_live"],
                (mine.live_margin_fraction, found["ours_live"]),
                koordinator_sweeps[resource],
                part,
                node_steps,
                margin_name,
            )
    return NodeBacktestResult(
        where,
        decision_days,
        start,
        step_seconds,
        fleet.origin,
        offered,
        summaries,
        sweeps,
        fair,
        time.perf_counter() - started,
        line_sweeps=line_sweeps,
        koordinator_sweeps=koordinator_sweeps,
        equal=equal,
    )


@dataclass(frozen=True)
class LiveRiseTables:
    """Per decision day, each node's live rise tables as the daily training learns them then (`level_rise_table`
    and `activity_rise_tables` of the days before it) and the level they are binned over."""

    tables: list[FloatArray]  # per day: nodes x LEVEL_BINS
    references: list[FloatArray]  # per day: nodes
    per_day: int
    #: per day: the calm and the active steps' tables and the boundary between them (None: no split)
    split: list[tuple[FloatArray, FloatArray, FloatArray]] | None = None

    def rise(self, level: FloatArray, activity: FloatArray | None = None) -> FloatArray:
        """The rise allowed above each live `level` (nodes x evaluated steps), by the table of its day: the calm or
        the active one by the node's `activity` when measured with the level (unknown: the whole table)."""
        days = range(len(self.tables))
        out = []
        for d in days:
            span = slice(d * self.per_day, (d + 1) * self.per_day)
            if self.split is None or activity is None:
                out.append(colocation.level_rise(self.tables[d], level[:, span], self.references[d]))
                continue
            calm, active, edge = self.split[d]
            tables = (self.tables[d], calm, active)
            out.append(colocation.activity_rise(tables, edge, activity[:, span], level[:, span], self.references[d]))
        return np.concatenate(out, axis=1)


def live_rise_tables(
    grid: FloatArray,
    requested: FloatArray,
    decision_days: list[int],
    per_day: int,
    band_fraction: float,
    settings: ResourceColocation,
    activity_steps: int = 0,
) -> LiveRiseTables:
    """The live rise tables of every decision day, from the node grid before it; binned over the node's requests at
    the decision (its peak usage where it has none), as `NodeForecaster.predict` does; split by activity over
    `activity_steps` (0: not)."""
    tables, references, split = [], [], []
    for day in decision_days:
        t = day * per_day
        reference = np.array(
            [live_rise_reference(grid[n : n + 1, :t], float(requested[n, t - 1])) for n in range(len(grid))]
        )
        steps = settings.live_rise_history_days * per_day
        tables.append(level_rise_table(grid[:, :t], reference, band_fraction, steps))
        if activity_steps:
            split.append(activity_rise_tables(grid[:, :t], reference, band_fraction, steps, activity_steps, tables[-1]))
        references.append(reference)
    return LiveRiseTables(tables, references, per_day, split if activity_steps else None)


#: Koordinator's knobs swept for the fair comparison, most room first: the usage policy's reclaim threshold (whole
#: percents, as Koordinator keeps it) and koordlet's mid safety margin (percent above the predicted peaks).
USAGE_THRESHOLD_GRID = tuple(float(p) for p in range(100, 0, -1))
MID_SAFETY_MARGIN_GRID = tuple(float(p) for p in range(0, 1001, 20))
#: The method each fair comparison tunes Koordinator against, and which Koordinator rule it tunes.
FAIR_PAIRS = {
    "ours": "usage",
    "ours_forecast_only": "usage",
    "koordinator_our_ratio": "usage",
    "ours_live": "usage",
    "ours_live_line": "usage",
    "ours_mid": "mid",
}


def node_live_lines(
    grid: FloatArray,
    measured: npt.NDArray[np.bool_],
    origin: int,
    start: int,
    end: int,
    model: LiveLineForecaster,
    step: Step,
) -> FloatArray:
    """(nodes x steps of [start, end)) the node's learned live line as the live loop issues it every step: from the
    measured usage before that step (`measured` masks the grid: the gaps of an outage reach its fits and its issues),
    refitted on the columns before the first step and every `LIVE_LINE_REFIT_DAYS` after (`replay.learned_issues`),
    calibrated online; NaN where it cannot serve. Column 0 of `grid` starts at `origin` (Unix seconds)."""
    step_seconds = model.step_seconds
    plan = ReplayPlan(
        origin + start * step_seconds, origin + end * step_seconds, step_seconds, LIVE_LINE_REFIT_DAYS * 86400
    )
    seen = np.where(measured, grid, np.nan)
    lines: FloatArray = learned_issues(seen, origin, plan, clone(model), step).T
    return lines


def koordinator_usage(alloc: FloatArray, live_usage: FloatArray, age: FloatArray) -> Callable[[float], FloatArray]:
    """Koordinator's usage policy on its live usage at a reclaim threshold (percent): its one knob."""

    def usage(percent: float) -> FloatArray:
        return colocation.koordinator_batch(alloc[:, None], percent, 0.0, 0.0, live_usage, age)

    return usage


def _fair_comparisons(
    offers: Offered,
    parts: dict[str, slice],
    step_seconds: int,
    alloc: FloatArray,
    live_usage: FloatArray,
    age: FloatArray,
    koordinator_mid: Callable[[float], FloatArray],
) -> dict[str, Tuned]:
    """Per method, Koordinator with its knob tuned on the validation days to at most that method's violations there
    (`tuned_threshold`); None when no swept value is that safe."""
    usage = koordinator_usage(alloc, live_usage, age)
    out: dict[str, Tuned] = {}
    for method, rule in FAIR_PAIRS.items():
        bound = _summary_of(offers, offers.batch[method], parts["validation"], step_seconds).violations
        make, grid = (usage, USAGE_THRESHOLD_GRID) if rule == "usage" else (koordinator_mid, MID_SAFETY_MARGIN_GRID)
        out[method] = tuned_threshold(offers, make, grid, bound, parts, step_seconds)
    return out
