"""The composite estimator: everything we learn about a fleet of workload containers from tidy usage.

`WorkloadRecommender.fit(usage)` takes a tidy usage frame (the columns of the shared data format) and fits, per
(namespace, workload, container) with pods pooled, six sub-estimators given as its parameters (unfitted templates,
cloned at each fit, as scikit-learn's meta-estimators do):
- VPA's CPU histogram and memory-peak histogram (request target and bounds),
- Koordinator's mid rule for the long-term reservation, per resource,
- the seasonal-max short-term reservation (and, from it, the peak forecast),
- the `vpa` request policy (`VpaRecommender`),
and per resource the selected, calibrated forecasts of a `FleetForecaster`. The request sizing's parameters are
its own scalars. `predict(as_of, horizon_seconds)` turns them into a `RecommendationSet`, the JSON contract of the
project (`models.recommendation` builds the API objects; `models.pods` keeps the pod and OOM bookkeeping).
`from_settings` builds one from the settings groups in one call, as the pipelines do.
"""

from __future__ import annotations

import functools
import itertools
import json
import weakref
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal, Self

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from models._validation import factorize_labels, require_columns
from models.ensemble import (
    CONSTANT_FORECASTERS,
    LINE_DAYS,
    LONG_TERM_DAYS,
    CandidateScores,
    FleetUsage,
    FutureUsage,
    PeakForecaster,
    SelectedForecaster,
    burst_labels,
    burstiness,
    candidate_lines,
    history_summary,
    line_forecaster,
    merge_sketches,
    model_name,
    rolling_origins,
    selection_rows,
)
from models.forecast import STEPS_PER_DAY, nan_quantile, usage_grid
from models.histogram import DecayingHistogram, MemoryPeakHistogram
from models.live_line import AdaptiveScale, LiveIssue, LiveLineForecaster
from models.migration import FORECAST_PARAMETERS, migrate_workload_state
from models.pod_spread import PodSpread
from models.pods import (
    CURRENT_COLUMNS,
    SAMPLE_COLUMNS,
    USAGE_COLUMNS,
    Sketch,
    describe_workloads,
    group_label,
    merge_pod_states,
    oom_counts,
    oom_frame,
    pod_pairs,
    pod_states,
    sample_steps,
    with_group_labels,
)
from models.recommendation import ResourceLines, floats_or_none, sizer, stale_hold, with_vpa
from models.reservation import PercentileReservation, SeasonalMaxReservation, peak_of
from models.settings import ModelSettings
from models.vpa import VpaRecommender
from recommender.arrays import FloatArray, IntArray, UInt64Array
from recommender.ceiling import (
    LIMIT_COLUMNS,
    THROTTLED_COLUMNS,
    ceiling_evidence,
    ceiling_rules,
    usage_ceiling,
    within_ceiling,
)
from recommender.limits import Resource
from recommender.policy import request_policy_for
from recommender.resources import (
    CurrentResources,
    History,
    LineLevels,
    LineQuality,
    RecommendationSet,
    ResourceRecommendation,
    WorkloadRecommendation,
)
from recommender.settings import ForecastSettings, HistogramSettings, PolicySettings, RequestPolicyRule
from recommender.trusted import constructor
from recommender.units import SECONDS_PER_DAY


@dataclass(frozen=True)
class ResourceForecast:
    """One resource's fitted forecast models for every group; lines start `grid_end` (Unix seconds)."""

    short_term: SelectedForecaster
    request: SelectedForecaster
    long_term: SelectedForecaster
    peak: PeakForecaster
    grid_end: int
    #: Set by the live loop (`WorkloadRecommender.live_update`): the grid end its newest samples reach, where the
    #: lines' recent state (fast up, staleness) now stands, and the request's floor from those samples.
    recent_end: int | None = None
    request_floor: FloatArray | None = None
    #: Set by the live loop too: every group's line names and qualities (`described`), which only a refit changes,
    #: so a pass does not format them again for every container.
    descriptions: LineDescriptions | None = None

    def lines(self, as_of: int, horizon_seconds: int, step_seconds: int) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Short-term line (groups x steps), request and long-term values at `as_of` (NaN where none). The fitted
        profiles keep their place from `grid_end`; the fast-up head follows the recent state (`recent_end`)."""
        per_day = self.short_term.steps_per_day
        gap = max(int((as_of - self.grid_end) // step_seconds), 0)
        # Steps since the recent state; past a day the head is long gone, so the drawn array stays bounded.
        recent = min(max(int((as_of - (self.recent_end or self.grid_end)) // step_seconds), 0), per_day, gap)
        # Lines repeat daily after the first day, so a long offset is cut to a day plus its remainder (bounded memory).
        offset = gap - recent
        offset = offset if offset < per_day else per_day + offset % per_day
        steps = int(np.ceil(horizon_seconds / step_seconds))
        short = self.short_term.predict(recent + steps, offset)[:, recent:]
        request = self.request.predict(recent + 1, offset)[:, -1]
        if self.request_floor is not None:
            # Fast up for the request too: never below the recent samples at its own risk level (NaN stays NaN).
            request = np.where(np.isnan(request), request, np.fmax(request, self.request_floor))
        return short, request, self.long_term.predict(recent + 1, offset)[:, -1]

    def following(self, grid: FloatArray, grid_end: int) -> ResourceForecast:
        """These fitted models with their recent state taken from `grid` (the same rows, newer samples, ending at
        `grid_end`): no refit, so a minute's update costs a pass over the grid."""
        summaries: dict[int, FloatArray] = {}
        for model in (self.short_term, self.request, self.long_term):
            # One pass over the grid per distinct window (the lines share one by default); read-only, so shared.
            if model.recent_steps not in summaries:
                summaries[model.recent_steps] = history_summary(grid, model.recent_steps)
            model.summary_ = summaries[model.recent_steps]
        recent = grid[:, -self.request.recent_steps :]
        floor = nan_quantile(recent, 1.0 - self.request.target_violation) if recent.shape[1] else None
        described = self.descriptions or self.described(np.arange(self.short_term.choice_.size))
        return replace(self, recent_end=grid_end, request_floor=floor, descriptions=described)

    def described(self, groups: IntArray) -> LineDescriptions:
        """The line names and qualities of `groups` (rows of the fitted grid), keyed by the JSON's line names."""
        names = {field: getattr(self, field).model_names() for field in LINES}
        return LineDescriptions(
            names={
                line: [self.describe(getattr(self, field), group, names[field]) for group in groups.tolist()]
                for line, field in _FORECAST_LINE.items()
            },
            quality={line: self.qualities(getattr(self, field), groups) for line, field in _FORECAST_LINE.items()},
            peak=self.peak.name(),
        )

    def qualities(self, model: SelectedForecaster, groups: IntArray) -> list[LineQuality]:
        """Per group of `groups`: the chosen candidate's rolling-origin cost, the best other cost, and the calibration
        factor (the costs' arrays are read once for all groups: a pass of the live loop asks for every container)."""
        costs = model.costs_[:, groups]
        choice = model.choice_[groups].astype(np.int64)
        columns = np.arange(groups.size)
        chosen = costs[choice, columns]
        others = np.where(np.isfinite(costs), costs, np.inf)
        others[choice, columns] = np.inf
        best_other = others.min(axis=0) if others.shape[0] else np.full(groups.size, np.inf)
        fleet = model.fleet_costs_[choice, 0]
        factors = model.factors_[groups]
        # Six significant digits: the costs' last bits depend on how many containers were scored together (numpy's
        # summation order), and a distributed run must give the same JSON as one process.
        return [
            LineQuality.model_construct(
                cost=_significant(c) if np.isfinite(c) else None,
                next_best_cost=_significant(b) if np.isfinite(b) else None,
                fleet_overprovision=_significant(f) if np.isfinite(f) else None,
                calibration_factor=float(k),
            )
            for c, b, f, k in zip(chosen.tolist(), best_other.tolist(), fleet.tolist(), factors.tolist())
        ]

    def describe(self, model: SelectedForecaster, group: int, names: list[str]) -> str:
        """Name of the candidate `model` chose for a group (`names`: its `model_names()`, computed once per line: a
        scikit-learn repr costs milliseconds), with its rolling-origin cost and calibration factor."""
        choice = int(model.choice_[group])
        cost = model.costs_[choice, group]
        scored = f"cost={cost:.3g}" if np.isfinite(cost) else "not yet backtested"
        return f"{names[choice]} {scored} x{model.factors_[group]:.3g}"


def _per_pod(quality: LineQuality, pod_factor: float) -> LineQuality:
    """A line's quality with the factor that holds it for every pod (the shared object where that is 1)."""
    return quality if pod_factor == 1.0 else quality.model_copy(update={"pod_factor": pod_factor})


@dataclass(frozen=True)
class LineDescriptions:
    """Per line (`target`, `short_term`, `long_term`) and group, the chosen model's name and quality, and the peak
    model's name: what `predict` writes into each recommendation's `models`."""

    names: dict[str, list[str]]
    quality: dict[str, list[LineQuality]]
    peak: str


LINES = tuple(LINE_DAYS)  # short_term, request, long_term


@dataclass(frozen=True)
class FleetStatistics:
    """The small, mergeable part of a fit that depends on the whole fleet: the time between consecutive samples
    (distinct step -> count, for the median of VPA's confidence) and each forecast line's calibration sketch
    (`"cpu.short_term"` -> sketch). Partitions return theirs; `merge` adds them up exactly."""

    sample_steps: Sketch
    calibration: dict[str, Sketch]

    @classmethod
    def merge(cls, parts: list[FleetStatistics]) -> FleetStatistics:
        names = sorted({name for part in parts for name in part.calibration})
        return cls(
            sample_steps=merge_sketches([p.sample_steps for p in parts]),
            calibration={n: merge_sketches([p.calibration[n] for p in parts if n in p.calibration]) for n in names},
        )


def median_of_counts(values: IntArray, counts: IntArray, default: float) -> float:
    """np.median of the multiset where each value occurs `counts` times (`default` when empty)."""
    total = int(counts.sum())
    if total == 0:
        return default
    order = np.argsort(values)
    ranks = np.cumsum(counts[order])
    low = values[order][int(np.searchsorted(ranks, (total + 1) // 2))]
    high = values[order][int(np.searchsorted(ranks, total // 2 + 1))]
    return float((float(low) + float(high)) / 2)


def summarize_selection(parts: list[dict[str, tuple[list[str], IntArray, FloatArray]]]) -> dict[str, float]:
    """Per resource and line, the share of containers on each candidate and the mean rolling-origin cost of the
    chosen ones, over the `selection_choices` of one fit or of every partition of a fleet."""
    summary: dict[str, float] = {}
    for key in sorted({key for part in parts for key in part}):
        present = [part[key] for part in parts if key in part]
        names = present[0][0]
        choice = np.concatenate([p[1] for p in present])
        costs = np.concatenate([p[2] for p in present])
        if choice.size == 0:
            continue
        for index in np.unique(choice):
            summary[f"{key}.share.{names[index]}"] = round(float(np.mean(choice == index)), 4)
        if np.isfinite(costs).any():
            summary[f"{key}.mean_cost"] = round(float(np.mean(costs[np.isfinite(costs)])), 6)
    return summary


def fit_resource_forecast(grid: FloatArray, settings: ForecastSettings, grid_end: int) -> ResourceForecast:
    """The forecast models of one resource on a usage grid (rows: workload containers, or nodes' pooled usage), each
    line built for its risk level in `settings`: `fit_resource_forecasts` of one partition."""
    return fit_resource_forecasts([grid], settings, grid_end)[0]


def fit_resource_forecasts(
    grids: list[FloatArray], settings: ForecastSettings, grid_end: int, keys: list[UInt64Array] | None = None
) -> list[ResourceForecast]:
    """The forecast models of one resource for each partition's usage grid (the same grid end; a narrower grid is one
    whose containers started later, padded with unknown days), chosen and calibrated on all of them as one fleet: a
    fleet fitted in partitions gets what it gets in one piece.

    Memory follows the work, not candidates x origins x containers x steps: only containers with a day of samples
    are backtested and fitted (a newer one's line is its cold start, `finish_line`), a constant candidate's past
    lines are one value per origin and container, the usage after each origin is cut from the grid a block of
    containers at a time, a candidate shared by several lines is backtested once, and only the chosen candidates are
    fitted.

    Past `settings.selection_max_containers`, the choice and the calibration are made on that many of them (those
    of the smallest `keys`, one per grid row: a hash of its container, so the same containers however the fleet is
    partitioned); every other container is fitted with its burstiness group's choice and the fleet's factor."""
    per_day = STEPS_PER_DAY
    width = max(grid.shape[1] for grid in grids)
    grids = [
        g if g.shape[1] == width else np.pad(g, ((0, 0), (width - g.shape[1], 0)), constant_values=np.nan)
        for g in grids
    ]
    rows = [np.flatnonzero(np.sum(~np.isnan(grid), axis=1) >= per_day) for grid in grids]
    offsets = np.cumsum([0] + [grid.shape[0] for grid in grids])
    if keys is None:
        keys = [pd.util.hash_array(np.arange(a, b, dtype=np.int64)) for a, b in itertools.pairwise(offsets)]
    origins = rolling_origins(width, settings.selection_days, per_day)
    decided = selection_rows(scored_rows(grids, rows, origins), keys, settings.selection_max_containers)

    def after_origins(which: list[IntArray]) -> FleetUsage:
        """The usage after each origin of the grids' rows `which`, read from the grids themselves a block of
        containers at a time: no copy of a partition's grid outlives its backtest or its chosen candidates' fit."""
        return FleetUsage([FutureUsage(g, origins, LONG_TERM_DAYS * per_day, rows=r) for g, r in zip(grids, which)])

    usage = after_origins(decided)
    rest = [np.setdiff1d(r, d, assume_unique=True) for r, d in zip(rows, decided)]
    rest_usage = after_origins(rest) if any(r.size for r in rest) else None

    def cut(part: int, which: list[IntArray]) -> FloatArray:
        grid, r = grids[part], which[part]
        return grid if r.size == grid.shape[0] else grid[r]

    rest_burstiness: dict[int, FloatArray] = {}

    def rest_groups(
        fleet: SelectedForecaster, days: int, decided_usage: FleetUsage, scores: CandidateScores
    ) -> list[IntArray | None]:
        """Per grid, the burstiness group of each container the choice was not made on (-1 for the others), by the
        bounds of the groups the choice was made in (`decided_usage`: theirs over the line's horizon)."""
        if rest_usage is None or fleet.groups <= 1:  # one group: every container takes the fleet's choice
            return [None] * len(grids)
        if days not in rest_burstiness:
            rest_burstiness[days] = burstiness(rest_usage.first(days * per_day))
        labels = burst_labels(rest_burstiness[days], scores.edges(decided_usage, fleet.groups))
        placed: list[IntArray | None] = []
        for grid, at, part in zip(grids, rest, rest_usage.part_rows(), strict=True):
            groups = np.full(grid.shape[0], -1, dtype=np.int64)
            groups[at] = labels[part]
            placed.append(groups)
        return placed

    starts = usage.starts.tolist()
    past: dict[str, FloatArray] = {}
    fitted: list[dict[str, BaseEstimator]] = [{} for _ in grids]

    def backtest(candidates: list[BaseEstimator]) -> list[FloatArray]:
        # Every candidate not yet backtested, fitted together at each origin (`candidate_lines`).
        new = list({model_name(c): c for c in candidates if model_name(c) not in past}.values())
        if new:
            constant = [isinstance(c, CONSTANT_FORECASTERS) for c in new]
            # The fleet's arrays, each partition's lines written into its containers' part (no per-partition copy).
            lines = [np.full((len(origins), starts[-1], 1 if flat else per_day), np.nan) for flat in constant]
            for p, part in enumerate(usage.part_rows()):
                candidate_lines(cut(p, decided), new, origins, per_day, constant, [line[:, part] for line in lines])
            for candidate, line in zip(new, lines):
                past[model_name(candidate)] = line
        return [past[model_name(c)] for c in candidates]

    def fit_scored(candidates: list[BaseEstimator], part: int) -> Callable[[int], BaseEstimator]:
        grid = functools.cache(lambda: cut(part, rows))  # cut once for the line's chosen candidates, then let go

        def fit(m: int) -> BaseEstimator:
            key = model_name(candidates[m])
            if key not in fitted[part]:
                fitted[part][key] = clone(candidates[m]).fit(grid())
            return fitted[part][key]

        return fit

    models = []
    fleets = [line_forecaster(settings, line) for line in LINES]
    backtest([candidate for fleet in fleets for candidate in fleet.candidate_models()])  # all lines' at once
    # The usage after the origins over each line's horizon, and the candidates' scores against it (`CandidateScores`).
    horizons = {fleet.horizon_days: (usage.first(fleet.horizon_days * per_day), CandidateScores()) for fleet in fleets}
    for fleet in fleets:
        candidates, days = fleet.candidate_models(), fleet.horizon_days
        fleet.decide(backtest(candidates), *horizons[days])
        groups = rest_groups(fleet, days, *horizons[days])
        models.append(
            [
                fleet.take(p).fit_chosen(grids[p], fit_scored(candidates, p), rows[p], decided[p], groups[p])
                for p in range(len(grids))
            ]
        )
    peak = PeakForecaster(selection_days=settings.selection_days, quantile=settings.peak_quantile)
    peak.fit_parts(grids)
    return [
        ResourceForecast(
            short_term=models[0][p],
            request=models[1][p],
            long_term=models[2][p],
            peak=peak.take(slice(int(offsets[p]), int(offsets[p + 1]))),
            grid_end=grid_end,
        )
        for p in range(len(grids))
    ]


def scored_rows(grids: list[FloatArray], rows: list[IntArray], origins: list[int]) -> list[IntArray]:
    """Of each grid's `rows`, those with a sample after the first origin: a container gone before the selection
    days has no usage to score a line against, so the choice is made without it (it takes its group's choice and
    factor, as a container outside a sample does) instead of carrying its lines through every score. All of them
    when none has (nothing to choose on either way) or there is no origin."""
    if not origins:
        return rows
    scored = [r[np.any(~np.isnan(grid[r, origins[0] :]), axis=1)] for grid, r in zip(grids, rows)]
    return scored if any(r.size for r in scored) else rows


def level_key(label: str, overrides: dict[str, float], defaults: tuple[float, float, float]) -> str:
    """The risk levels of a group's three lines as a key, `"short/request/long"`: an override for its workload
    (`namespace/workload`) or namespace, else the per-line `defaults`."""
    namespace, workload, _ = json.loads(label)
    level = overrides.get(f"{namespace}/{workload}", overrides.get(namespace))
    levels = [level] * 3 if level is not None else list(defaults)
    return "/".join(f"{value:g}" for value in levels)


def parse_level_key(key: str) -> tuple[float, ...]:
    return tuple(float(part) for part in key.split("/"))


class FleetForecaster(BaseEstimator):  # type: ignore[misc]
    """The forecasts of one resource over a fleet's usage grid (rows: workload containers, or nodes' pooled usage):
    candidates built for each line's risk level, chosen and calibrated on rolling origins (`fit_resource_forecast`).

    Its parameters are the `ForecastSettings` fields that shape the forecasts (see there for units, defaults and
    reasons), as scalars so `set_params` and `clone` reach them; `fit(grid, grid_end=...)` keeps the fitted lines in
    `forecast_` (a `ResourceForecast`)."""

    def __init__(
        self,
        short_term_target_violation: float = 0.01,
        request_target_violation: float = 0.01,
        long_term_target_violation: float = 0.01,
        selection_days: int = 7,
        selection_max_containers: int = 0,
        history_days: int = 14,
        selection_groups: int = 3,
        group_min_gain: float = 0.1,
        group_min_containers: int = 20,
        validation_days: int = 2,
        selection_min_containers: int = 30,
        fairness_tolerance: float = 1.0,
        choice_min_gain: float = 0.05,
        calibration_prior_samples: float = 1e9,
        group_prior_samples: float = 1e9,
        calibration_factor_min: float = 0.25,
        calibration_factor_max: float = 4.0,
        seasonal_days: int = 7,
        narrow_window_steps: int = 3,
        wide_window_steps: int = 12,
        recent_window_steps: int = 12,
        cold_start_factor: float = 1.5,
        stale_after_seconds: float = 3 * 86400.0,
        peak_quantile: float = 0.55,
        use_stl: bool = False,
    ) -> None:
        self.short_term_target_violation = short_term_target_violation
        self.request_target_violation = request_target_violation
        self.long_term_target_violation = long_term_target_violation
        self.selection_days = selection_days
        self.selection_max_containers = selection_max_containers
        self.history_days = history_days
        self.selection_groups = selection_groups
        self.group_min_gain = group_min_gain
        self.group_min_containers = group_min_containers
        self.validation_days = validation_days
        self.selection_min_containers = selection_min_containers
        self.fairness_tolerance = fairness_tolerance
        self.choice_min_gain = choice_min_gain
        self.calibration_prior_samples = calibration_prior_samples
        self.group_prior_samples = group_prior_samples
        self.calibration_factor_min = calibration_factor_min
        self.calibration_factor_max = calibration_factor_max
        self.seasonal_days = seasonal_days
        self.narrow_window_steps = narrow_window_steps
        self.wide_window_steps = wide_window_steps
        self.recent_window_steps = recent_window_steps
        self.cold_start_factor = cold_start_factor
        self.stale_after_seconds = stale_after_seconds
        self.peak_quantile = peak_quantile
        self.use_stl = use_stl

    @classmethod
    def from_settings(cls, forecast: ForecastSettings) -> FleetForecaster:
        # A settings group pickled before one of its fields existed (an old store's) lacks it: its default then.
        given, fields = vars(forecast), ForecastSettings.model_fields
        return cls(**{name: given.get(name, fields[name].default) for name in cls._get_param_names()})

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Pickled before the choice was made on a sample of a big fleet, or before its time split: those refit with
        # today's defaults.
        for name in ("selection_max_containers", "validation_days", "selection_min_containers", "choice_min_gain"):
            state.setdefault(name, ForecastSettings.model_fields[name].default)
        super().__setstate__(state)

    def settings(self) -> ForecastSettings:
        """These parameters as the settings group the candidate and selection builders (`models.ensemble`) read."""
        return ForecastSettings(**self.get_params())

    def levels(self) -> tuple[float, float, float]:
        """The risk levels of the short-term, request and long-term lines."""
        return self.short_term_target_violation, self.request_target_violation, self.long_term_target_violation

    def fit(self, X: FloatArray, y: Any = None, grid_end: int = 0) -> Self:
        """`X`: a (rows x 5-minute steps) usage grid whose last column ends at `grid_end` (Unix seconds)."""
        self.forecast_ = fit_resource_forecast(X, self.settings(), grid_end)
        return self


def vpa_estimator(hist: HistogramSettings, policy: PolicySettings) -> VpaRecommender:
    """The `vpa` request policy's estimator with these settings (VPA's own defaults unless overridden)."""
    return VpaRecommender(
        **{
            name: getattr(hist, name)
            for name in VpaRecommender._get_param_names()
            if name in HistogramSettings.model_fields
        },
        **{
            name: getattr(policy, name)
            for name in VpaRecommender._get_param_names()
            if name in PolicySettings.model_fields
        },
    )


#: The `PolicySettings` fields that are `WorkloadRecommender` parameters: the ones VPA's rules do not share. The
#: percentiles, safety margin, confidence factors and pod minimums are VPA's, so both request policies read them from
#: the `vpa` part (`set_params(vpa__target_percentile=0.95)`).
POLICY_PARAMETERS = tuple(name for name in PolicySettings.model_fields if name not in VpaRecommender._get_param_names())
#: The resources, and the unit in the names of their parameters and columns (`pod_min_cpu_cores`,
#: `memory_request_bytes`), so code that loops over resources reads names, not a cpu/memory branch.
UNITS: dict[Resource, str] = {"cpu": "cores", "memory": "bytes"}


@functools.cache
def _default_parts() -> WorkloadRecommender:
    """The sub-estimators of the settings' defaults, for parameters left None (only ever cloned)."""
    return WorkloadRecommender.from_settings(ModelSettings())


def _samples(usage: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per resource, the (group, pod, timestamp, value) samples the histograms and reservations fit on."""
    keys = {name: usage[name] for name in ("group", "pod", "timestamp")}
    # Columns of the usage frame, not copies of them (the estimators only read them).
    return {
        resource: pd.DataFrame({**keys, "value": usage[f"{resource}_{unit}"]}, copy=False)
        for resource, unit in UNITS.items()
    }


class WorkloadRecommender(BaseEstimator):  # type: ignore[misc]
    """Histogram models and reservation lines for every workload container of a tidy usage frame.

    Parameters: the six sub-estimators (unfitted; None: the settings' defaults) and the forecaster, cloned at each
    fit so `set_params(cpu_histogram__half_life_seconds=...)` and `clone` reach their scalars; then the forecast's
    switches and per-workload risk levels and the request sizing (`PolicySettings`' fields, see there for units,
    defaults and reasons; the ones VPA's rules share are the `vpa` part's, read by both request policies).
    Fitted: `cpu_histogram_` ... `vpa_`, the forecasts per risk level (`cpu_forecasts_`, `memory_forecasts_`), the
    pod and workload state (`pods_`, `workloads_`, `oom_kills_`) and the usage grids."""

    def __init__(
        self,
        cpu_histogram: DecayingHistogram | None = None,
        memory_histogram: MemoryPeakHistogram | None = None,
        cpu_long_term: PercentileReservation | None = None,
        memory_long_term: PercentileReservation | None = None,
        short_term: SeasonalMaxReservation | None = None,
        vpa: VpaRecommender | None = None,
        forecast: FleetForecaster | None = None,
        forecast_enabled: bool = True,
        target_violation_overrides: dict[str, float] | None = None,
        memory_peak_margin_fraction: float = 0.15,
        cpu_pod_spread_half_life_seconds: float = 7 * 86400.0,
        memory_pod_spread_half_life_seconds: float = 0.0,
        ceiling_near_limit_fraction: float = 0.95,
        ceiling_throttled_fraction: float = 0.05,
        request_policy: Literal["forecast", "vpa"] = "forecast",
        request_policy_rules: list[RequestPolicyRule] | None = None,
        min_confidence_days: float = 1 / 24,
        min_allowed_cpu_cores: float | None = None,
        max_allowed_cpu_cores: float | None = None,
        min_allowed_memory_bytes: float | None = None,
        max_allowed_memory_bytes: float | None = None,
        min_samples: int = 12,
        live_line: LiveLineForecaster | None = None,
        live_line_enabled: bool = True,
    ) -> None:
        self.cpu_histogram = cpu_histogram
        self.memory_histogram = memory_histogram
        self.cpu_long_term = cpu_long_term
        self.memory_long_term = memory_long_term
        self.short_term = short_term
        self.vpa = vpa
        self.forecast = forecast
        self.forecast_enabled = forecast_enabled
        self.target_violation_overrides = target_violation_overrides
        self.memory_peak_margin_fraction = memory_peak_margin_fraction
        self.cpu_pod_spread_half_life_seconds = cpu_pod_spread_half_life_seconds
        self.memory_pod_spread_half_life_seconds = memory_pod_spread_half_life_seconds
        self.ceiling_near_limit_fraction = ceiling_near_limit_fraction
        self.ceiling_throttled_fraction = ceiling_throttled_fraction
        self.request_policy = request_policy
        self.request_policy_rules = request_policy_rules
        self.min_confidence_days = min_confidence_days
        self.min_allowed_cpu_cores = min_allowed_cpu_cores
        self.max_allowed_cpu_cores = max_allowed_cpu_cores
        self.min_allowed_memory_bytes = min_allowed_memory_bytes
        self.max_allowed_memory_bytes = max_allowed_memory_bytes
        self.min_samples = min_samples
        self.live_line = live_line
        self.live_line_enabled = live_line_enabled

    @classmethod
    def from_settings(cls, settings: ModelSettings) -> WorkloadRecommender:
        """The recommender of these settings groups: each resource's pair of settings becomes its sub-estimator."""
        hist, res, forecast = settings.histogram, settings.reservation, settings.forecast
        buckets = {"bucket_growth_ratio": hist.bucket_growth_ratio, "epsilon": hist.epsilon}
        cpu_buckets = {**buckets, "first_bucket_size": hist.cpu_first_bucket_cores, "max_value": hist.cpu_max_cores}
        memory_buckets = {
            **buckets,
            "first_bucket_size": hist.memory_first_bucket_bytes,
            "max_value": hist.memory_max_bytes,
        }
        return cls(
            cpu_histogram=DecayingHistogram(
                **cpu_buckets, half_life_seconds=hist.cpu_half_life_seconds, sample_weight=hist.cpu_sample_weight
            ),
            memory_histogram=MemoryPeakHistogram(
                **memory_buckets,
                half_life_seconds=hist.memory_half_life_seconds,
                peak_weight=hist.memory_peak_weight,
                interval_seconds=hist.memory_aggregation_interval_seconds,
                interval_count=hist.memory_aggregation_interval_count,
                oom_min_bump_bytes=hist.oom_min_bump_bytes,
                oom_bump_ratio=hist.oom_bump_ratio,
            ),
            cpu_long_term=PercentileReservation(
                **cpu_buckets,
                percentile=res.long_term_cpu_percentile,
                margin_fraction=res.long_term_margin_fraction,
                half_life_seconds=res.long_term_cpu_half_life_seconds,
            ),
            memory_long_term=PercentileReservation(
                **memory_buckets,
                percentile=res.long_term_memory_percentile,
                margin_fraction=res.long_term_margin_fraction,
                half_life_seconds=res.long_term_memory_half_life_seconds,
            ),
            short_term=SeasonalMaxReservation(
                step_seconds=res.step_seconds,
                recent_window_seconds=res.recent_window_seconds,
                seasonal_days=res.seasonal_days,
                slot_tolerance_seconds=res.slot_tolerance_seconds,
            ),
            vpa=vpa_estimator(hist, settings.policy),
            forecast=FleetForecaster.from_settings(forecast),
            forecast_enabled=forecast.enabled,
            target_violation_overrides=dict(forecast.target_violation_overrides),
            memory_peak_margin_fraction=forecast.memory_peak_margin_fraction,
            # An old store's settings group, pickled before these fields existed, lacks them: their defaults then.
            **{
                name: getattr(forecast, name, ForecastSettings.model_fields[name].default)
                for name in FORECAST_PARAMETERS
            },
            **{name: getattr(settings.policy, name) for name in POLICY_PARAMETERS},
            live_line=LiveLineForecaster.from_settings(
                settings.live_line, forecast.short_term_target_violation, res.step_seconds
            ),
            live_line_enabled=settings.live_line.enabled and forecast.enabled,
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(migrate_workload_state(state, lambda old: type(self).from_settings(old).get_params(False)))

    def _part(self, name: str) -> Any:
        """The sub-estimator parameter `name`, or the settings' default one; read it, never fit it."""
        given = getattr(self, name)
        return given if given is not None else getattr(_default_parts(), name)

    def _pod_spread(self, resource: str) -> PodSpread | None:
        """A new `PodSpread` on the buckets of the resource's histogram; None when pods are not counted."""
        half_life: float = getattr(self, f"{resource}_pod_spread_half_life_seconds")
        if not half_life:
            return None
        histogram = self._part(f"{resource}_histogram")
        return PodSpread(
            half_life_seconds=half_life,
            step_seconds=self._step_seconds(),
            first_bucket_size=histogram.first_bucket_size,
            max_value=histogram.max_value,
            epsilon=histogram.epsilon,
        )

    def pod_ratios(self, resource: str, violation: float, groups: pd.Index) -> FloatArray:
        """Per group, the factor that brings a line learned on each step's busiest pod to `violation` of every pod's
        samples (`PodSpread.ratios`; 1 where a group ran one pod at a time, or pods are not counted)."""
        spread: PodSpread | None = getattr(self, f"{resource}_pod_spread_", None)
        return np.ones(len(groups)) if spread is None else spread.ratios(violation, groups)

    def _forecaster(self) -> FleetForecaster:
        forecaster: FleetForecaster = self._part("forecast")
        return forecaster

    def _step_seconds(self) -> int:
        return int(self._part("short_term").step_seconds)

    def _policy(self) -> PolicySettings:
        """The request sizing parameters (ours and the `vpa` part's) as the settings group the core's rules
        (`recommender.policy`) read."""
        vpa = self._part("vpa").get_params()
        shared = {name: vpa[name] for name in PolicySettings.model_fields if name in vpa}
        own = {name: getattr(self, name) for name in POLICY_PARAMETERS}
        return PolicySettings(**{**shared, **own, "request_policy_rules": list(self.request_policy_rules or [])})

    def _sizing(self, resource: Resource) -> tuple[float, float | None, float | None]:
        """A resource's smallest request per pod (the `vpa` part's `pod_min_cpu_cores`) and its allowed range
        (`min_allowed_cpu_cores`, ...)."""
        suffix = f"{resource}_{UNITS[resource]}"
        return (
            getattr(self._part("vpa"), f"pod_min_{suffix}"),
            getattr(self, f"min_allowed_{suffix}"),
            getattr(self, f"max_allowed_{suffix}"),
        )

    def fit(
        self,
        X: pd.DataFrame,
        y: Any = None,
        oom_events: pd.DataFrame | None = None,
        data_end: int | None = None,
        fit_forecasts: bool = True,
    ) -> Self:
        """Learn from tidy usage rows; `oom_events` (timestamp, namespace, workload, pod, container and optionally
        memory_bytes at the kill) bumps the memory histogram as VPA does. `data_end`: the fleet's newest sample when
        X is one partition of it, so every partition's forecast grid ends at the same step (default: X's newest).
        `fit_forecasts=False` leaves the forecasts to `fit_fleet_forecasts` over every partition of the fleet."""
        require_columns(X, USAGE_COLUMNS, type(self).__name__)
        if len(X) == 0:
            raise ValueError("no usage rows to learn from")
        usage = with_group_labels(X)
        samples = _samples(usage)
        kills = oom_frame(oom_events, usage)
        for resource, values in samples.items():
            setattr(self, f"{resource}_long_term_", clone(self._part(f"{resource}_long_term")).fit(values))
            setattr(self, f"{resource}_short_term_", clone(self._part("short_term")).fit(values))
        self.cpu_histogram_ = clone(self._part("cpu_histogram")).fit(samples["cpu"])
        self.memory_histogram_ = clone(self._part("memory_histogram")).fit(samples["memory"], oom_events=kills)
        for resource, values in samples.items():
            spread = self._pod_spread(resource)
            setattr(self, f"{resource}_pod_spread_", None if spread is None else spread.fit(values))
        # Usage under-reports what an OOM-killed container needed: its memory target never drops below VPA's bumped one.
        self.oom_kills_ = oom_counts(kills)
        self.pods_ = pod_states(usage)
        self.workloads_ = describe_workloads(self.pods_)
        self.vpa_ = clone(self._part("vpa"))
        self.vpa_.fit(*self._vpa_input(usage, oom_events))
        self.sample_steps_ = sample_steps(usage)
        self.sample_interval_seconds_ = median_of_counts(*self.sample_steps_, default=60.0)
        self.data_end_ = int(usage["timestamp"].max()) if data_end is None else int(data_end)
        self.forecast_groups_ = np.asarray(
            self._forecast_groups(pd.Index(usage["group"].cat.categories.astype(str))), dtype=str
        )
        self.grid_end_ = self._grid_end()
        groups = pd.Index(self.forecast_groups_)
        self.cpu_grid_ = self._usage_grid(usage, "cpu_cores", groups)
        self.memory_grid_ = self._usage_grid(usage, "memory_bytes", groups)
        # The per-sample frames are not needed by the forecasts, which peak in memory: let them go first.
        del usage, samples, kills
        if fit_forecasts:
            self._fit_forecasts()
        return self

    def partial_fit(
        self, X: pd.DataFrame, y: Any = None, oom_events: pd.DataFrame | None = None, data_end: int | None = None
    ) -> Self:
        """Continue from the learned state with samples newer than those seen: the decaying histograms come out as
        one fit on all the data would make them, so a daily run reads one day, not the whole history. `data_end`
        as in `fit` (the fleet's newest sample, when X is one partition's)."""
        if not hasattr(self, "workloads_"):
            return self.fit(X, oom_events=oom_events, data_end=data_end)
        require_columns(X, USAGE_COLUMNS, type(self).__name__)
        if len(X) == 0:
            return self
        self._continue(X, oom_events, data_end, new_forecast_groups=True)
        self._fit_forecasts()
        return self

    def live_update(self, X: pd.DataFrame, oom_events: pd.DataFrame | None = None) -> Self:
        """`partial_fit` without the refit of the forecast models (the live loop, every minute): the histograms, OOM
        kills, request bounds and usage grid continue exactly; the fitted forecasts keep their choice, calibration
        and profiles and take only their recent state from the new samples (fast up). Containers that become
        forecastable meanwhile keep the foundation's lines until the next training refits."""
        check_is_fitted(self, "workloads_")
        require_columns(X, USAGE_COLUMNS, type(self).__name__)
        if len(X) == 0:
            return self
        usage = self._continue(X, oom_events, None, new_forecast_groups=False)
        for name, grid in (("cpu_forecasts_", self.cpu_grid_), ("memory_forecasts_", self.memory_grid_)):
            forecasts: dict[str, ResourceForecast] = getattr(self, name)
            setattr(self, name, {key: f.following(grid, self.grid_end_) for key, f in forecasts.items()})
        self._issue_live_lines(usage)
        return self

    def _issue_live_lines(self, usage: pd.DataFrame | None = None) -> None:
        """The live cadence's step: the online calibration learns from the steps completed since the last issue
        (the grid's newest columns against the line then in force; with `usage`, the pass's samples, each pod's
        own samples where a container ran several), then a line is issued from the grid's end."""
        pods = None if usage is None else self._pass_pods(usage)
        for resource, column in zip(UNITS, ("cpu_cores", "memory_bytes")):
            model: LiveLineForecaster | None = getattr(self, f"{resource}_live_line_", None)
            if model is None:
                continue
            grid: FloatArray = getattr(self, f"{resource}_grid_")
            scale: AdaptiveScale = getattr(self, f"{resource}_live_scale_")
            issued: LiveIssue | None = getattr(self, f"{resource}_live_issued_")
            if issued is not None and issued.lines.size == grid.shape[0]:
                # The steps the line in force covered: from its issue on, as many as its block holds (a pass after a
                # gap brings more, which the day-ahead line served).
                since = int((self.grid_end_ - issued.at) // model.step_seconds)
                done = min(since, model.horizon_steps) if since <= grid.shape[1] else 0
                stop = grid.shape[1] - (since - done)
                if done > 0 and usage is not None and pods is not None:
                    observed = self._pod_grid(usage, pods, column, done, issued.at + done * model.step_seconds)
                    scale = scale.updated(issued.lines, observed, pods[1])
                elif done > 0:
                    scale = scale.updated(issued.lines, grid[:, stop - done : stop])
            lines = model.issue(grid, self.grid_end_, scale.factors(grid.shape[0]))
            setattr(self, f"{resource}_live_scale_", scale)
            setattr(self, f"{resource}_live_issued_", LiveIssue(self.grid_end_, lines, scale.factors(grid.shape[0])))

    def _pass_pods(self, usage: pd.DataFrame) -> tuple[IntArray, IntArray, npt.NDArray[np.bool_]] | None:
        """A pass's samples as pods of the grid's rows: each sample's pod code, each pod's row, and which samples are
        of a forecast row; None where every container ran one pod in them (the grid's per-step maxima are its usage)."""
        rows = self._group_rows(usage, pd.Index(self.forecast_groups_))
        forecast = rows >= 0
        pairs, owners = pod_pairs(rows[forecast], factorize_labels(usage["pod"])[0][forecast])
        return None if owners.size == np.unique(owners).size else (pairs, owners, forecast)

    def _pod_grid(
        self,
        usage: pd.DataFrame,
        pods: tuple[IntArray, IntArray, npt.NDArray[np.bool_]],
        column: str,
        steps: int,
        end: int,
    ) -> FloatArray:
        """Each pod's own usage (`_pass_pods`) over the `steps` of the grid before `end`, pods x steps."""
        pairs, owners, forecast = pods
        return usage_grid(
            pairs,
            usage["timestamp"].to_numpy(dtype=np.float64)[forecast],
            usage[column].to_numpy(dtype=np.float64)[forecast],
            owners.size,
            end,
            steps,
            self._step_seconds(),
        )

    def _continue(
        self, X: pd.DataFrame, oom_events: pd.DataFrame | None, data_end: int | None, new_forecast_groups: bool
    ) -> pd.DataFrame:
        """Everything of `partial_fit` but the forecasts' refit (`data_end` as there); `new_forecast_groups`: let groups that now have
        enough samples into the grid (only a refit can draw their lines). Returns the samples with their group labels."""
        usage = with_group_labels(X)
        samples = _samples(usage)
        kills = oom_frame(oom_events, usage)
        for resource, values in samples.items():
            getattr(self, f"{resource}_long_term_").partial_fit(values)
            getattr(self, f"{resource}_short_term_").partial_fit(values)
        self.cpu_histogram_.partial_fit(samples["cpu"])
        self.memory_histogram_.partial_fit(samples["memory"], oom_events=kills)
        for resource, values in samples.items():
            # A version stored before pods were counted starts counting them now.
            spread = getattr(self, f"{resource}_pod_spread_", None) or self._pod_spread(resource)
            setattr(self, f"{resource}_pod_spread_", None if spread is None else spread.partial_fit(values))
        self.pods_ = merge_pod_states(self.pods_, pod_states(usage))
        self.workloads_ = describe_workloads(self.pods_)
        if not hasattr(self, "vpa_"):
            self.vpa_ = clone(self._part("vpa"))
        self.vpa_.partial_fit(*self._vpa_input(usage, oom_events))
        # A pass of one sample per pod shows no interval: the one learned before stands (VPA's 60 s default would make
        # the bounds published until the next training those of a history sampled five times as often).
        steps = sample_steps(usage)
        if steps[0].size:
            self.sample_steps_ = steps
            self.sample_interval_seconds_ = median_of_counts(*steps, default=60.0)
        self.data_end_ = max(self.data_end_, int(usage["timestamp"].max()) if data_end is None else int(data_end))
        self.oom_kills_ = self.oom_kills_.add(oom_counts(kills), fill_value=0).astype(np.int64)
        # The forecast models' grid slides to the new end and takes the new samples, then they are refitted on it, except by `live_update`.
        old_groups = pd.Index(self.forecast_groups_)
        groups = (
            old_groups.append(self._forecast_groups(pd.Index(usage["group"].cat.categories.astype(str)))).unique()
            if new_forecast_groups
            else old_groups
        )
        end = self._grid_end()
        step = self._step_seconds()
        shift = max(int((end - self.grid_end_) // step), 0)
        self.grid_end_ = end
        width = self._grid_steps(groups)
        for name, column in (("cpu_grid_", "cpu_cores"), ("memory_grid_", "memory_bytes")):
            old = getattr(self, name)
            if len(groups) == len(old_groups) and old.shape[1] == width:
                # The live loop's grids get spare columns; a training's slide once, in place (no second grid).
                spare = not new_forecast_groups
                setattr(self, name, self._slide_in_place(old, shift, usage, column, groups, spare))
                continue
            slid = np.full((len(groups), width), np.nan)
            # Old column j is new column j + offset: both grids end at their grid end, the new one `shift` later.
            offset = width - old.shape[1] - shift
            first = max(0, -offset)
            if first < old.shape[1]:
                slid[: len(old_groups), first + offset : old.shape[1] + offset] = old[:, first:]
            setattr(self, name, np.fmax(slid, self._usage_grid(usage, column, groups)))
        self.forecast_groups_ = np.asarray(groups, dtype=str)
        return usage

    def _slide_in_place(
        self, grid: FloatArray, shift: int, usage: pd.DataFrame, column: str, groups: pd.Index, spare: bool
    ) -> FloatArray:
        """`grid` (same rows and width as before) moved `shift` steps to the new end and maxed with `usage`: what the
        general slide gives (a new NaN grid, the old columns copied in, `np.fmax` with a grid of the usage) without
        its three grid-sized temporaries. With `spare`, the grid becomes a window over a wider array
        (`_SpareColumns`) that a pass moves forward, so a pass copies nothing (before: the whole grid, 320 MB a
        resource at 10,000 containers); the columns move back once the spare ones are used up. A live pass brings
        a step or two: only the columns from its oldest sample on are gridded and maxed."""
        width = grid.shape[1]
        shift = min(shift, width)
        if shift:
            grid = _SPARE.moved(grid, shift, spare)
        step = self._step_seconds()
        oldest = float(usage["timestamp"].min())
        # Columns from the one holding the oldest sample to the end (all of them for an older sample).
        columns = int(min(width, max(0, (self.grid_end_ - oldest) // step + 1)))
        if columns:
            recent = grid[:, width - columns :]
            np.fmax(recent, self._usage_grid(usage, column, groups, columns), out=recent)
        return grid

    def fleet_statistics(self) -> FleetStatistics:
        """This fit's share of the fleet-level quantities (see `FleetStatistics`)."""
        check_is_fitted(self, "workloads_")
        return FleetStatistics(
            sample_steps=self.sample_steps_,
            calibration={
                f"{name}.{line}": getattr(forecast, line).ratio_sketch_
                for name, forecast in self._forecasts()
                for line in LINES
            },
        )

    def _forecasts(self) -> list[tuple[str, ResourceForecast]]:
        """Every fitted forecast as (`"cpu@0.01/0.01/0.01"`, forecast): one per resource and set of risk levels, so
        partitions of a fleet merge the calibration of the same lines at the same levels."""
        return [
            (f"{resource}@{level}", forecast)
            for resource, forecasts in (("cpu", self.cpu_forecasts_), ("memory", self.memory_forecasts_))
            for level, forecast in forecasts.items()
        ]

    def calibrate_with_fleet(self, fleet: FleetStatistics) -> Self:
        """Make a partition's fit what a fit on the whole fleet gives: the fleet's sample interval and calibration
        factors (the driver of distributed training merges every partition's `fleet_statistics` into `fleet`)."""
        check_is_fitted(self, "workloads_")
        self.sample_interval_seconds_ = median_of_counts(*fleet.sample_steps, default=60.0)
        for name, forecast in self._forecasts():
            for line in LINES:
                getattr(forecast, line).calibrate_with_fleet(fleet.calibration[f"{name}.{line}"])
        return self

    def vpa_summary(self) -> dict[str, float]:
        """Flat fit metrics of the `vpa` policy: its workload containers and the samples VPA's rules refused, by reason."""
        vpa: VpaRecommender | None = getattr(self, "vpa_", None)
        if vpa is None or not vpa.states_:
            return {}
        refused = {f"vpa.skipped.{reason}": float(count) for reason, count in sorted(vpa.skipped_.items()) if count}
        return {"vpa.workload_containers": float(len(vpa.states_)), **refused}

    def selection_summary(self) -> dict[str, float]:
        """Flat fit metrics of the model selection (stored in the version's manifest): see `summarize_selection`."""
        return summarize_selection([self.selection_choices()])

    def selection_choices(self) -> dict[str, tuple[list[str], IntArray, FloatArray]]:
        """Per resource and line (`"cpu.short_term"`): candidate names, the chosen candidate per container and its
        rolling-origin cost; small, so partitions of a fleet return them for one summary."""
        check_is_fitted(self, "workloads_")
        choices = {}
        for name, forecast in self._forecasts():
            members = self.group_levels_ == name.split("@", 1)[1]
            for line in LINES:
                model: SelectedForecaster = getattr(forecast, line)
                costs = model.costs_[model.choice_, np.arange(model.choice_.size)]
                choices[f"{name}.{line}"] = (model.model_names(), model.choice_[members], costs[members])
        return choices

    def _forecast_groups(self, groups: pd.Index) -> pd.Index:
        """The groups of `groups` with `min_samples` samples of a resource: only these are forecast, so memory and
        time follow the containers that can get a recommendation (a group that crosses the minimum in a later
        `partial_fit` enters the grid with the samples from then on)."""
        counts = self.workloads_.reindex(groups)[list(SAMPLE_COLUMNS)].fillna(0).max(axis=1)
        return groups[counts.to_numpy() >= self.min_samples]

    def _grid_end(self) -> int:
        """End of the forecast grid: the step after the newest sample."""
        step = self._step_seconds()
        return (self.data_end_ // step + 1) * step

    def _grid_steps(self, groups: pd.Index) -> int:
        """Width of the forecast grid: the last selection + history days before `grid_end_`, cut to the whole days
        since the first sample of `groups` (a fleet with an hour of history needs a day of columns, not 22)."""
        forecaster = self._forecaster()
        per_day = 86400 // self._step_seconds()
        first = self.workloads_["first_sample"].reindex(groups).min() if len(groups) else np.nan
        span_days = int(np.ceil((self.grid_end_ - first) / 86400)) if np.isfinite(first) else 1
        return min(forecaster.selection_days + forecaster.history_days + 1, max(span_days, 1)) * per_day

    def _usage_grid(self, usage: pd.DataFrame, column: str, groups: pd.Index, steps: int | None = None) -> FloatArray:
        """Per-step maxima (pods pooled) over the `steps` (default `_grid_steps`) before `grid_end_`, rows in
        `groups` order."""
        step = self._step_seconds()
        return usage_grid(
            self._group_rows(usage, groups),
            usage["timestamp"].to_numpy(dtype=np.float64),
            usage[column].to_numpy(dtype=np.float64),
            len(groups),
            self.grid_end_,
            self._grid_steps(groups) if steps is None else steps,
            step,
        )

    @staticmethod
    def _group_rows(usage: pd.DataFrame, groups: pd.Index) -> IntArray:
        """Each sample's row in `groups` (-1: a group not among them)."""
        found = groups.get_indexer(usage["group"].cat.categories.astype(str))[usage["group"].cat.codes.to_numpy()]
        rows: IntArray = found.astype(np.int64)
        return rows

    def _fit_forecasts(self) -> None:
        """One forecast per resource and distinct set of risk levels (the default, and each override in use), each on
        the whole fleet's grid: the fleet chooses and calibrates at that level, its containers take the lines."""
        fit_fleet_forecasts([self])

    def vpa_groups(self, labels: Any) -> npt.NDArray[np.bool_]:
        """Which of these group labels the `vpa` request policy sizes (`request_policy` and its rules)."""
        if not self.request_policy_rules:
            return np.full(len(labels), self.request_policy == "vpa")
        policy = self._policy()
        keys = [json.loads(label) for label in labels]
        return np.array([request_policy_for(key[0], key[1], policy) == "vpa" for key in keys], dtype=np.bool_)

    def _vpa_input(
        self, usage: pd.DataFrame, oom_events: pd.DataFrame | None
    ) -> tuple[pd.DataFrame, None, pd.DataFrame | None]:
        """The rows (and OOM kills) of the groups the `vpa` policy sizes, as `VpaRecommender.fit` takes them. An OOM
        kill's request is the pod's memory request where known (VPA reads it from the pod), else the memory at the
        kill the file gives (as VPA's eviction events give usage), else 0."""
        categories = usage["group"].cat.categories.astype(str)
        chosen = self.vpa_groups(categories)
        columns = ["group", "pod", "timestamp", "cpu_cores", "memory_bytes"]
        if not chosen.any():
            return usage.iloc[:0][columns], None, None
        rows = usage[chosen[usage["group"].cat.codes.to_numpy()]] if not chosen.all() else usage
        samples = rows[columns].assign(group=rows["group"].astype(str))
        if oom_events is None or len(oom_events) == 0:
            return samples, None, None
        events = with_group_labels(oom_events)
        events = events.assign(group=events["group"].astype(str))
        events = events[self.vpa_groups(events["group"].tolist())] if len(events) else events
        request = self.pods_["memory_request_bytes"].reindex(
            pd.MultiIndex.from_arrays([events["group"], events["pod"]])
        )
        at_kill = events["memory_bytes"] if "memory_bytes" in events.columns else pd.Series(np.nan, index=events.index)
        request_bytes = np.where(
            np.isfinite(request.to_numpy(dtype=np.float64)),
            request.to_numpy(dtype=np.float64),
            at_kill.to_numpy(dtype=np.float64),
        )
        return (
            samples,
            None,
            events[["group", "pod", "timestamp"]].assign(request_bytes=np.nan_to_num(request_bytes, nan=0.0)),
        )

    def predict(self, as_of: int | None = None, horizon_seconds: int = 86400) -> RecommendationSet:
        """Recommendations for every learned workload container at decision time `as_of` (default: data end)."""
        check_is_fitted(self, "workloads_")
        step = self.cpu_short_term_.step_seconds
        decision = int(self.data_end_ + 1 if as_of is None else as_of)
        everyone, memo = self.workloads_.index, dict[str, Any]()
        out = []
        for start in range(0, len(everyone), _PREDICT_ROWS):
            block = _Block(everyone, slice(start, start + _PREDICT_ROWS), memo)
            out.extend(self._predict_block(block, decision, horizon_seconds))
        return RecommendationSet.model_construct(
            as_of=decision, horizon_seconds=int(horizon_seconds), step_seconds=int(step), recommendations=out
        )

    def _predict_block(self, block: _Block, decision: int, horizon_seconds: int) -> list[WorkloadRecommendation]:
        """The recommendations of a block of the groups (`predict`)."""
        policy = self._policy()
        described = self.workloads_.iloc[block.rows]
        groups = block.groups
        confidence = self._confidence_days(block)
        per_pod = described["containers_per_pod"].to_numpy(dtype=np.float64)
        vpa = dict(zip(UNITS, self._vpa_bounds(groups, per_pod, decision)))
        now = {c: described[c].to_numpy(dtype=np.float64) for c in CURRENT_COLUMNS}
        recs: dict[str, list[ResourceRecommendation | None]] = {}
        recent: dict[str, list[list[float | None]]] = {}
        evidence = {resource: self.recent_samples(resource, block) for resource in UNITS}
        for resource, unit in UNITS.items():
            pod_minimum, *allowed = self._sizing(resource)
            size = sizer(confidence, per_pod, pod_minimum, allowed[0], allowed[1], policy)
            request, limit = now[f"{resource}_request_{unit}"], now[f"{resource}_limit_{unit}"]
            lines = self._resource(resource, block, decision, horizon_seconds, size, evidence[resource])
            recs[resource] = [
                with_vpa(resource, rec, vpa[resource], i, (allowed[0], allowed[1]), request[i], limit[i])
                for i, rec in enumerate(lines)
            ]
            recent[resource] = self._recent(resource, block, decision, recs[resource])
        # Column by column, each converted to Python values in C (`to_dict`, and `iterrows` before it, made a Python
        # object per cell through pandas: most of the time of 10,000 containers' objects).
        names = {c: described[c].to_numpy(dtype=object).tolist() for c in ("namespace", "workload", "container")}
        counts = {c: described[c].to_numpy(dtype=np.int64).tolist() for c in _DESCRIBED_COLUMNS if c not in names}
        currents = [
            dict(zip(CURRENT_COLUMNS, values))
            for values in zip(
                *(floats_or_none(described[c].to_numpy(dtype=np.float64, na_value=np.nan)) for c in CURRENT_COLUMNS)
            )
        ]
        recent_samples = {resource: [round(v, 2) for v in evidence[resource].tolist()] for resource in UNITS}
        kills = self.oom_kills_.reindex(groups, fill_value=0).to_numpy(dtype=np.int64).tolist()
        # Built, not validated (see `ResourceLines.recommendations`): every value is of its field's type.
        return [
            _BUILD_RECOMMENDATION(
                namespace=str(names["namespace"][i]),
                workload=str(names["workload"][i]),
                container=str(names["container"][i]),
                cpu=recs["cpu"][i],
                memory=recs["memory"][i],
                current=_BUILD_CURRENT(**currents[i]),
                history=_BUILD_HISTORY(
                    first_sample=counts["first_sample"][i],
                    last_sample=counts["last_sample"][i],
                    pods=counts["pods"][i],
                    replicas=counts["replicas"][i],
                    samples=counts["samples"][i],
                    cpu_samples=counts["cpu_samples"][i],
                    memory_samples=counts["memory_samples"][i],
                    cpu_recent_samples=recent_samples["cpu"][i],
                    memory_recent_samples=recent_samples["memory"][i],
                    oom_kills=kills[i],
                    recent_cpu_cores=recent["cpu"][i],
                    recent_memory_bytes=recent["memory"][i],
                ),
            )
            for i in range(len(described))
        ]

    def vpa_checkpoint(self, namespace: str, workload: str, container: str, now: float) -> dict[str, Any] | None:
        """The VerticalPodAutoscalerCheckpoint status VPA would write for a container the `vpa` policy sizes (None
        for others), for a VPA recommender to continue from."""
        check_is_fitted(self, "workloads_")
        label = group_label(namespace, workload, container)
        vpa: VpaRecommender | None = getattr(self, "vpa_", None)
        return vpa.checkpoint(label, now) if vpa is not None and label in vpa.states_ else None

    def warm_started(
        self, rec: WorkloadRecommendation, checkpoint: dict[str, Any], as_of: int
    ) -> WorkloadRecommendation:
        """`rec` with the `vpa` policy's target and bounds recomputed from its learned state merged with a VPA
        checkpoint status (as VPA merges the checkpoints it starts from). Containers of the forecast policy come
        back unchanged; a malformed checkpoint raises ValueError naming the problem."""
        check_is_fitted(self, "workloads_")
        label = group_label(rec.namespace, rec.workload, rec.container)
        vpa: VpaRecommender | None = getattr(self, "vpa_", None)
        if vpa is None or label not in self.workloads_.index or not self.vpa_groups([label])[0]:
            return rec
        vpa.warm_start(label, checkpoint, as_of)
        try:
            groups = pd.Index([label])
            described = self.workloads_.reindex(groups)
            per_pod = described["containers_per_pod"].to_numpy(dtype=np.float64)
            bounds = dict(zip(UNITS, self._vpa_bounds(groups, per_pod, as_of)))
        finally:
            vpa.initial_.pop(label, None)
        now = {c: float(described[c].iloc[0]) for c in CURRENT_COLUMNS}
        update: dict[str, ResourceRecommendation | None] = {}
        for resource, unit in UNITS.items():
            _, low, high = self._sizing(resource)
            request, limit = now[f"{resource}_request_{unit}"], now[f"{resource}_limit_{unit}"]
            update[resource] = with_vpa(
                resource, getattr(rec, resource), bounds[resource], 0, (low, high), request, limit
            )
        return rec.model_copy(update=update)

    def _vpa_bounds(self, groups: pd.Index, per_pod: FloatArray, as_of: int) -> tuple[FloatArray, FloatArray]:
        """Per group, the `vpa` policy's (target, lower, upper) of CPU in cores and memory in bytes (groups x 3): NaN
        for groups of the forecast policy, -1 where VPA would have no recommendation (its aggregate expired)."""
        cpu, memory = np.full((len(groups), 3), np.nan), np.full((len(groups), 3), np.nan)
        vpa: VpaRecommender | None = getattr(self, "vpa_", None)
        if vpa is None:
            return cpu, memory
        known = set(vpa.groups())
        for i, label in enumerate(groups):
            if label not in known:
                continue
            found = vpa.recommend(label, int(per_pod[i]), as_of)
            if found is None:
                cpu[i] = memory[i] = -1.0
                continue
            cpu[i] = [found[0].target / 1000, found[0].lower_bound / 1000, found[0].upper_bound / 1000]
            memory[i] = [found[1].target, found[1].lower_bound, found[1].upper_bound]
        return cpu, memory

    def recent_samples(self, resource: str, block: _Block) -> FloatArray:
        """Per group, its samples of `resource` counted by recent weight (`DecayingHistogram.recent_samples`, with
        the half-life of the histogram holding every sample: VPA's CPU histogram, 24 h; memory's long-term one, 24 h,
        as VPA's memory peaks keep one sample a day); 0 for a group without one."""
        histogram: DecayingHistogram = self.cpu_histogram_ if resource == "cpu" else self.memory_long_term_.histogram_
        return np.nan_to_num(block.aligned(f"{resource}.recent", histogram.recent_samples, histogram.groups_), nan=0.0)

    def has_evidence(self, recent_samples: FloatArray) -> npt.NDArray[np.bool_]:
        """Whether counts of `recent_samples` support a recommendation: `min_samples` of them, rounded to whole
        samples (an hour of fresh 5-minute samples weighs 11.85: it counts as the 12 it is)."""
        enough: npt.NDArray[np.bool_] = np.rint(recent_samples) >= self.min_samples
        return enough

    def _confidence_days(self, block: _Block) -> FloatArray:
        """VPA's confidence: min(history length, samples x sample interval), in days, per group."""
        hist = self.cpu_histogram_
        index = block.positions(hist.groups_)
        span = np.where(index >= 0, block.once("cpu.history_days", hist.history_days)[index], 0.0)
        count = np.where(index >= 0, hist.sample_count_[index], 0)
        covered = count * self.sample_interval_seconds_ / 86400.0
        result: FloatArray = np.minimum(span, covered)
        return result

    def _forecast_lines(
        self, resource: str, block: _Block, as_of: int, horizon_seconds: int, step: int
    ) -> dict[str, Any]:
        """Per group (in `groups` order): our short-term line, request, long-term and peak values from the forecast of
        its risk levels (NaN where a forecast drew none, e.g. stale), the levels, and per line the model's name and
        quality."""
        forecasts: dict[str, ResourceForecast] = getattr(self, f"{resource}_forecasts_")
        groups = block.groups
        n_steps = int(np.ceil(horizon_seconds / step))
        out: dict[str, Any] = {
            "short_term": np.full((len(groups), n_steps), np.nan),
            "request": np.full(len(groups), np.nan),
            "long_term": np.full(len(groups), np.nan),
            "peak": np.full(len(groups), np.nan),
            "levels": [None] * len(groups),
            "names": [dict[str, str]() for _ in groups],
            "quality": [dict[str, LineQuality]() for _ in groups],
            "stale": np.zeros(len(groups), dtype=bool),
        }
        own = block.positions(self.forecast_groups_)
        keys = np.full(len(groups), None, dtype=object)
        keys[own >= 0] = self.group_levels_[own[own >= 0]]
        for key, forecast in forecasts.items():
            rows = np.flatnonzero(keys == key)
            if rows.size == 0:
                continue
            # Drawn for every group of the forecast once, for all the blocks.
            drawn = block.once(
                f"{resource}.lines.{key}", functools.partial(forecast.lines, as_of, horizon_seconds, step)
            )
            short, request, long_term = (line[own[rows]] for line in drawn)
            levels = parse_level_key(key)
            # Learned on each step's busiest pod, held for every pod: each line (by its JSON name) at its level of the
            # pods' own samples.
            ratios = {
                line: block.once(
                    f"{resource}.pod_ratio.{level:g}",
                    functools.partial(self.pod_ratios, resource, level, block.everyone),
                )[block.rows][rows]
                for line, level in zip(("short_term", "target", "long_term"), levels)
            }
            out["short_term"][rows] = short * ratios["short_term"][:, None]
            out["request"][rows] = request * ratios["target"]
            out["long_term"][rows] = long_term * ratios["long_term"]
            out["peak"][rows] = block.once(f"{resource}.peak.{key}", forecast.peak.predict)[own[rows]]
            # Steps without a sample up to the decision time, not only to the data's end: a model used days later
            # (or a decision long after the last row) must not call a silent container fresh.
            late = max(int((as_of - (forecast.recent_end or forecast.grid_end)) // step), 0)
            out["stale"][rows] = forecast.short_term.summary_[own[rows], 3] + late >= forecast.short_term.stale_steps
            # The live loop's forecasts carry every group's (no refit since): the rows are their positions there.
            described = forecast.descriptions or forecast.described(own[rows])
            positions = own[rows].tolist() if forecast.descriptions else range(rows.size)
            # One object for the rows of these levels, as their qualities are (nothing changes a built line's parts).
            shared = _BUILD_LEVELS(short_term=levels[0], target=levels[1], long_term=levels[2])
            for at, (position, row) in enumerate(zip(positions, rows.tolist())):
                out["levels"][row] = shared
                out["names"][row] = {line: described.names[line][position] for line in _FORECAST_LINE}
                out["names"][row]["peak"] = described.peak
                out["quality"][row] = {
                    line: _per_pod(described.quality[line][position], float(ratios[line][at]))
                    for line in _FORECAST_LINE
                }
        return out

    def _resource(
        self, resource: Resource, block: _Block, as_of: int, horizon_seconds: int, bounds: Any, recent: FloatArray
    ) -> list[ResourceRecommendation | None]:
        """Our forecast lines where the models have data; the foundation's rules (named as such) elsewhere. A stale
        group (no sample for `stale_after_seconds`) holds its current request flat on every line (`stale_hold`) and
        says so."""
        histogram: DecayingHistogram | MemoryPeakHistogram = getattr(self, f"{resource}_histogram_")
        long_term: PercentileReservation = getattr(self, f"{resource}_long_term_")
        short_term: SeasonalMaxReservation = getattr(self, f"{resource}_short_term_")
        groups = block.groups
        fitted = histogram.groups_
        policy = self._part("vpa")
        percentiles = (policy.lower_bound_percentile, policy.target_percentile, policy.upper_bound_percentile)

        def nth(i: int) -> FloatArray:
            """The i-th percentile of every fitted group: the three from one pass over the histogram's weights."""
            every: list[FloatArray] = block.once(
                f"{resource}.quantiles", functools.partial(histogram.quantiles, percentiles)
            )
            return every[i]

        lower, target, upper = (
            block.aligned(f"{resource}.quantile.{i}", functools.partial(nth, i), fitted) for i in range(3)
        )
        step = short_term.step_seconds
        ours = self._forecast_lines(resource, block, as_of, horizon_seconds, step)
        ours_request = ours["request"]
        # No recommendation from too few samples: an empty histogram reads as the pod minimum, not as "unknown". They
        # count by recent weight: a history that stopped weeks ago does not size a container that resumed.
        enough = self.has_evidence(recent)
        # Memory is not compressible: an OOM kill outranks our request line, and the observed peak caps it.
        memory = resource == "memory"
        oom = np.isin(np.asarray(groups, dtype=str), self.oom_kills_.index)
        if memory:
            ours_request = np.where(oom, np.nan, ours_request)
        sized = bounds(lower, target, upper, ours_request)
        sized_target = sized.target
        # A limit we set never goes below the history window's highest usage (`limit_floor`): under it CPU is
        # throttled where it never was, memory is OOM-killed (memory's floor has a margin, and without an OOM kill it
        # also bounds the request, so a small fleet cannot inflate memory). A window of zeros bounds nothing (no
        # running container has no working set): VPA's minimum then stands.
        peak = self._highest_sample(resource, block, enough)
        margin = 1.0 + self.memory_peak_margin_fraction if memory else 1.0
        peak_bound = np.where(peak > 0, peak * margin, np.nan)
        if memory:
            sized_target = np.where(~oom & np.isfinite(peak_bound), np.fmin(sized_target, peak_bound), sized_target)
        long_values = block.aligned(f"{resource}.long_term", long_term.predict, long_term.groups_)
        has_line = ~np.isnan(ours["short_term"]).any(axis=1)
        current = self.workloads_.reindex(groups)
        # The foundation's line only where ours is missing (and a recommendation will be made).
        lines = ours["short_term"].copy()
        position = block.positions(short_term.groups_)
        needed = np.flatnonzero(~has_line & enough & (position >= 0))
        lines[needed] = short_term.predict(as_of, horizon_seconds, rows=position[needed])
        long_values = np.where(np.isnan(ours["long_term"]), long_values, ours["long_term"])
        stale = ours["stale"]
        request_now = current[f"{resource}_request_{UNITS[resource]}"].to_numpy(dtype=np.float64)
        limit_now = current[f"{resource}_limit_{UNITS[resource]}"].to_numpy(dtype=np.float64)
        stale_held = stale_hold(request_now, limit_now, sized_target)
        lines = np.where(stale[:, None], stale_held[:, None], lines)
        live, live_factor, live_steps = self._live_line(resource, block, as_of, step)
        live = np.where(stale | ~enough, np.nan, live)
        served = np.isfinite(live)
        lines[:, : live_steps[1]] = np.where(served[:, None], live[:, None], lines[:, : live_steps[1]])
        long_values = np.where(stale, stale_held, long_values)
        line_peak, peak_times = peak_of(lines, as_of, short_term.step_seconds)
        # Every line at most what the container can use, unless evidence says it needs more (`recommender.ceiling`);
        # the request's pod minimum and allowed minimum outrank the ceiling (a request below them is never written).
        ceiling, evidence = self._ceiling(resource, groups, current, peak)
        pod_minimum, min_allowed, _ = self._sizing(resource)
        per_pod = np.maximum(current["containers_per_pod"].to_numpy(dtype=np.float64), 1.0)
        uncapped_ceiling = np.where(np.isnan(ceiling), np.nan, np.maximum(ceiling, pod_minimum / per_pod))
        request_ceiling = np.maximum(uncapped_ceiling, -np.inf if min_allowed is None else min_allowed)
        before = {
            "target": sized_target,
            "uncapped_target": sized.uncapped_target,
            "upper_bound": sized.upper_bound,
            "short_term": lines,
            "live_short_term": live,
            "long_term": long_values,
            # The day's highest usage is never below the short-term line's highest step: a line built for a risk of
            # P has usage above it at P of the steps, so the day's maximum passes it (a peak under the line said the
            # reservation was for usage the forecast did not expect). On dev at 1 %, capping the peak at the line
            # instead cost 15 points of median error (CPU 16.9 -> 31.9 %).
            "peak": np.where(np.isnan(ours["peak"]) | stale, line_peak, np.fmax(ours["peak"], line_peak)),
        }
        # A stale container's lines hold what it asked for, as its page says: the ceiling leaves them.
        held_ceiling = np.where(stale, np.nan, ceiling)
        ceilings = {
            name: {"target": request_ceiling, "upper_bound": request_ceiling, "uncapped_target": uncapped_ceiling}.get(
                name, held_ceiling
            )
            for name in before
        }
        held = {name: within_ceiling(values, ceilings[name], evidence) for name, values in before.items()}
        sized_target = held["target"]
        sized = replace(sized, upper_bound=held["upper_bound"], uncapped_target=held["uncapped_target"])
        return ResourceLines(
            histogram_target=target,
            enough=enough,
            ours=ours,
            ours_request=ours_request,
            has_line=has_line,
            sized=sized,
            sized_target=sized_target,
            peak_bound=peak_bound,
            lines=held["short_term"],
            long_values=held["long_term"],
            peak_values=held["peak"],
            peak_times=peak_times,
            stale=stale,
            request_now=request_now,
            limit_now=limit_now,
            resource=resource,
            live=held["live_short_term"],
            live_factor=live_factor,
            live_block=(as_of, as_of + live_steps[1] * step),
            live_model=model.description if (model := getattr(self, f"{resource}_live_line_", None)) else "",
            ceiling=ceiling,
            ceiling_rules=ceiling_rules(before, ceilings, evidence),
        ).recommendations()

    def _ceiling(
        self, resource: Resource, groups: pd.Index, current: pd.DataFrame, highest: FloatArray
    ) -> tuple[FloatArray, list[str | None]]:
        """Per group, its usage ceiling, max(current limit, `highest`: the highest sample of the forecast's
        `history_days`), and the evidence that lifts it (`recommender.ceiling`). None (NaN) with forecasting off:
        those lines are the foundation's rules, kept as they are for the baselines."""
        n = len(groups)
        if not self.forecast_enabled:
            return np.full(n, np.nan), [None] * n
        limit = current[LIMIT_COLUMNS[resource]].to_numpy(dtype=np.float64)
        throttled_column = THROTTLED_COLUMNS[resource]
        throttled = current[throttled_column].to_numpy(dtype=np.float64) if throttled_column else np.full(n, np.nan)
        # An OOM kill is memory's evidence, throttling CPU's.
        kills = self.oom_kills_.reindex(groups, fill_value=0).to_numpy(dtype=np.float64) * (resource == "memory")
        evidence = ceiling_evidence(
            limit, highest, kills, throttled, self.ceiling_near_limit_fraction, self.ceiling_throttled_fraction
        )
        return usage_ceiling(limit, highest), evidence

    def _live_line(
        self, resource: str, block: _Block, as_of: int, step: int
    ) -> tuple[FloatArray, FloatArray, tuple[int, int]]:
        """Per group, the learned live line in force at `as_of` (NaN where it does not serve: no model, a row it
        could not forecast, a risk level of the group's own, or `as_of` past its block), its factor, and its block
        in steps from `as_of` (0 steps where none)."""
        groups = block.groups
        nothing = np.full(len(groups), np.nan)
        model: LiveLineForecaster | None = getattr(self, f"{resource}_live_line_", None)
        issued: LiveIssue | None = getattr(self, f"{resource}_live_issued_", None)
        if model is None or issued is None:
            return nothing, nothing, (0, 0)
        steps = int((issued.at + model.horizon_steps * model.step_seconds - as_of) // step)
        if steps <= 0 or as_of < issued.at - step:
            return nothing, nothing, (0, 0)
        own = block.positions(self.forecast_groups_)
        found = own >= 0
        keys, which = block.once(
            "levels", lambda: np.unique(np.asarray(getattr(self, "group_levels_", [])), return_inverse=True)
        )
        mine = np.array([np.isclose(parse_level_key(str(key))[0], model.target_violation) for key in keys], dtype=bool)
        same_level = np.zeros(len(groups), dtype=bool)
        if which.size == len(self.forecast_groups_):
            same_level[found] = mine[which[own[found]]]
        live, factor = nothing.copy(), nothing.copy()
        live[found], factor[found] = issued.lines[own[found]], issued.factors[own[found]]
        live = np.where(same_level, live, np.nan)
        return live, factor, (0, min(steps, model.horizon_steps))

    def _highest_sample(self, resource: Resource, block: _Block, recommended: npt.NDArray[np.bool_]) -> FloatArray:
        """Max usage (pods pooled) per group over the history window the lines use (`forecast.history_days` of the
        grid's last steps: a floor or a ceiling over less lets a peak 8-14 days old fall under it); NaN where none.
        `recommended`: the groups that get a recommendation (only these need one outside the grid)."""
        steps = self._forecaster().history_days * (SECONDS_PER_DAY // self._step_seconds())

        def grid_peak() -> FloatArray:
            window = getattr(self, f"{resource}_grid_")[:, -steps:]
            # fmax skips NaN in one pass over the grid, without a copy of it (a row of NaN stays NaN: none).
            peak: FloatArray = np.fmax.reduce(window, axis=1) if window.shape[1] else np.full(window.shape[0], -np.inf)
            return peak

        values = block.aligned(f"{resource}.highest", grid_peak, self.forecast_groups_)
        # A container that reached `min_samples` in a live pass has no grid row until the next training: the
        # short-term line's steps of the same window (it keeps a week of them) bound it meanwhile.
        short_term: SeasonalMaxReservation = getattr(self, f"{resource}_short_term_")
        missing = np.flatnonzero(~np.isfinite(values) & recommended)
        rows = block.positions(short_term.groups_)[missing]
        if (rows >= 0).any():
            step = short_term.step_seconds
            times = self.grid_end_ - steps * step + step * np.arange(steps, dtype=np.float64)
            values[missing[rows >= 0]] = short_term.observed_max(times, rows[rows >= 0])
        result: FloatArray = np.where(np.isfinite(values), values, np.nan)
        return result

    def _recent(
        self, resource: str, block: _Block, as_of: int, shown: list[ResourceRecommendation | None]
    ) -> list[list[float | None]]:
        """The observed usage line (max over pods per step) of the last day before as_of; None where no sample. Empty
        beside no recommendation (`shown`): nothing to compare it with, and 288 floats per container add up."""
        short_term: SeasonalMaxReservation = getattr(self, f"{resource}_short_term_")
        index = block.positions(short_term.groups_)
        wanted = np.flatnonzero((index >= 0) & np.array([rec is not None for rec in shown], dtype=bool))
        recent = short_term.recent(as_of, 86400, rows=index[wanted])
        # A row without a gap is a plain list (`tolist` in C); only rows with a gap map NaN to None.
        gaps: list[bool] = (np.isnan(recent).sum(axis=1) > 0).tolist()
        out: list[list[float | None]] = [[] for _ in shown]
        for at, row in enumerate(wanted.tolist()):
            out[row] = floats_or_none(recent[at]) if gaps[at] else recent[at].tolist()
        return out


#: Memory's forecasts chosen elsewhere (a side process): given the settings of one set of risk levels and the grid
#: end, a future of `fit_resource_forecasts` on the fleet's memory grids. It may raise `BrokenExecutor`.
ForecastsElsewhere = Callable[[ForecastSettings, int], "Future[list[ResourceForecast]]"]
#: One resource's forecasts being chosen, one per partition.
ResourceChoice = Future[list[ResourceForecast]]


def selection_keys(models: list[WorkloadRecommender]) -> list[UInt64Array]:
    """Per partition's grid row, a hash of its container's name (`forecast_groups_`): what a big fleet's choice is
    made on a sample by (`fit_resource_forecasts`), the same whatever the partitions."""
    return [pd.util.hash_array(model.forecast_groups_.astype(object)) for model in models]


def fit_fleet_forecasts(
    models: list[WorkloadRecommender],
    memory_elsewhere: ForecastsElsewhere | None = None,
    chosen: Callable[[], None] | None = None,
) -> None:
    """The forecasts of each model of `models` (partitions of one fleet, each fitted with `fit_forecasts=False` and
    the fleet's `data_end`), chosen and calibrated on all of their containers as one fleet: each partition gets
    what a fit on the whole fleet gives its containers. One forecast per resource and distinct set of risk levels
    in use anywhere in the fleet, each fitted on every container, as in one piece.

    CPU's and memory's are independent: memory's goes `memory_elsewhere` (a process of the caller's, so the two share
    neither the GIL nor the address space's lock that every fresh page takes) while CPU's runs here (and memory's
    too, after it, should that process break); without it, in two threads. The live lines read no forecast: they are
    fitted in the calling thread while the forecasts are chosen, which it otherwise only waits for. `chosen`: called
    once the forecasts and the live lines are in (the caller's process can end then)."""
    forecaster = models[0]._forecaster()
    if len({model.grid_end_ for model in models}) > 1:
        raise ValueError("partitions of a fleet must share the grid end: fit them with the fleet's data_end")
    for model in models:
        overrides = model.target_violation_overrides or {}
        model.group_levels_ = np.asarray(
            [level_key(label, overrides, forecaster.levels()) for label in model.forecast_groups_], dtype=object
        )
        model.cpu_forecasts_ = {}
        model.memory_forecasts_ = {}
    if not models[0].forecast_enabled:
        fit_live_lines(models)
        return
    keys = sorted({key for model in models for key in model.group_levels_.tolist()})
    grid_end = models[0].grid_end_
    containers = selection_keys(models)
    memory_grids = [m.memory_grid_ for m in models]
    # Otherwise CPU and memory in two threads: the work is mostly numpy sorting, which releases the GIL.
    with ThreadPoolExecutor(max_workers=1 if memory_elsewhere is not None else 2) as pool:

        def choose(key: str) -> tuple[ForecastSettings, ResourceChoice, ResourceChoice]:
            """The futures of CPU's and memory's forecasts at the risk levels of `key`, and their settings."""
            levels = dict(zip((f"{line}_target_violation" for line in LINES), parse_level_key(key)))
            settings = clone(forecaster).set_params(**levels).settings()
            try:
                if memory_elsewhere is None:
                    memory = pool.submit(fit_resource_forecasts, memory_grids, settings, grid_end, containers)
                else:
                    memory = memory_elsewhere(settings, grid_end)
            except BrokenExecutor:  # the side process died before (killed, out of memory): memory's are chosen here
                memory = pool.submit(fit_resource_forecasts, memory_grids, settings, grid_end, containers)
            cpu = pool.submit(fit_resource_forecasts, [m.cpu_grid_ for m in models], settings, grid_end, containers)
            return settings, cpu, memory

        choices = {key: choose(key) for key in keys}
        fit_live_lines(models)
        for key, (settings, cpu, memory) in choices.items():
            cpu_parts = cpu.result()
            try:
                memory_parts = memory.result()
            except BrokenExecutor:  # or while it chose them
                memory_parts = fit_resource_forecasts(memory_grids, settings, grid_end, containers)
            for model, cpu_part, memory_part in zip(models, cpu_parts, memory_parts):
                model.cpu_forecasts_[key], model.memory_forecasts_[key] = cpu_part, memory_part
    if chosen is not None:
        chosen()


def fit_live_lines(models: list[WorkloadRecommender]) -> None:
    """The learned live line per resource, fitted on the grids of every partition of the fleet as on one (None where
    it is off or the history is too short for it), and each partition's first line issued from it."""
    first = models[0]
    for resource in UNITS:
        fitted: LiveLineForecaster | None = None
        if first.live_line_enabled and first.forecast_enabled:
            grids = [getattr(model, f"{resource}_grid_") for model in models]
            try:
                fitted = clone(first._part("live_line")).fit_grids(grids, first.grid_end_)
            except ValueError:  # too little history: the day-ahead line alone
                fitted = None
        for model in models:
            setattr(model, f"{resource}_live_line_", fitted)
            setattr(model, f"{resource}_live_scale_", fitted.initial_scale() if fitted is not None else None)
            setattr(model, f"{resource}_live_issued_", None)
    for model in models:
        model._issue_live_lines()


def continue_calibration(previous: list[WorkloadRecommender], models: list[WorkloadRecommender]) -> None:
    """The live line's online calibration of `previous` (a version's models, a partition each, as the live loop
    continued them) carried into `models` (the next version's), container by container, and their first lines
    issued again with it. A version starts at factor 1, and `train` publishes one a day, so without this the loop
    threw each day's calibration away, the containers' slow factors with it (`replay` carries it across its refits,
    and is what the line is judged by). Each container keeps its whole log-factor (fleet + own); the fleet's, one
    for every partition, is their mean, so a container the old version did not have starts there. Not carried
    across a change of the risk level, or into a model without a learned line."""
    carried_into: dict[int, WorkloadRecommender] = {}  # by identity, in the order first carried into
    for resource in UNITS:
        logs: dict[str, float] = {}
        levels: set[float] = set()
        for model in previous:
            scale: AdaptiveScale | None = getattr(model, f"{resource}_live_scale_", None)
            if scale is None:
                continue
            levels.add(scale.target_violation)
            factors = np.log(scale.factors(len(model.forecast_groups_)))
            logs.update(zip(model.forecast_groups_.tolist(), factors.tolist()))
        found: list[tuple[WorkloadRecommender, AdaptiveScale, FloatArray]] = []
        for model in models:
            scale = getattr(model, f"{resource}_live_scale_", None)
            if scale is not None and levels == {scale.target_violation}:
                found.append((model, scale, np.array([logs.get(g, np.nan) for g in model.forecast_groups_.tolist()])))
        known = np.concatenate([carried for _, _, carried in found]) if found else np.empty(0)
        if not np.isfinite(known).any():
            continue
        fleet = float(np.nanmean(known))
        for model, scale, carried in found:
            own = np.where(np.isnan(carried), 0.0, carried - fleet)
            setattr(model, f"{resource}_live_scale_", replace(scale, fleet=fleet, own=own))
            setattr(model, f"{resource}_live_issued_", None)
            carried_into[id(model)] = model
    for model in carried_into.values():
        model._issue_live_lines()


def pool_calibration(models: list[WorkloadRecommender], before: list[dict[Resource, AdaptiveScale | None]]) -> None:
    """One fleet factor for a fleet fitted in partitions, as for one model: after a live pass in which each
    partition's model moved its own (`before`: each one's scales before the pass), the fleet's factor moves by the
    partitions' misses added up (`AdaptiveScale.last_relative_sum` over `last_served`), every partition takes it, and
    the lines in force are rescaled to it. Without this each partition calibrated its containers alone, so a
    container's line depended on the partition its name sorted into (`replay` and `backtest` calibrate the fleet as
    one). The containers' own factors stay centred within their partition."""
    for resource in UNITS:
        key = f"{resource}_live_scale_"
        scales: list[AdaptiveScale | None] = [getattr(model, key, None) for model in models]
        present = [(m, s, b[resource]) for m, s, b in zip(models, scales, before) if s is not None]
        if len(present) < 2:
            continue
        rows = np.array([m.forecast_groups_.size for m, _, _ in present], dtype=np.float64)
        start = np.array([s.fleet if b is None else b.fleet for _, s, b in present])
        moved = [s for _, s, b in present if b is not None and s is not b]
        served = sum(s.last_served for s in moved)
        shift = present[0][1].fleet_rate * sum(s.last_relative_sum for s in moved) / served if served > 0 else 0.0
        fleet = float(np.average(start, weights=np.maximum(rows, 1.0))) + shift
        for model, scale, _ in present:
            change = fleet - scale.fleet
            setattr(model, key, replace(scale, fleet=fleet))
            issued: LiveIssue | None = getattr(model, f"{resource}_live_issued_", None)
            if issued is not None and change != 0.0:
                factor = np.exp(change)
                setattr(
                    model,
                    f"{resource}_live_issued_",
                    replace(issued, lines=issued.lines * factor, factors=issued.factors * factor),
                )


def _significant(value: float, digits: int = 6) -> float:
    return float(f"{value:.{digits - 1}e}")


#: `predict`'s objects, built from values of their fields' types (`constructor`): 13 a container every live pass.
_BUILD_RECOMMENDATION = constructor(WorkloadRecommendation)
_BUILD_CURRENT = constructor(CurrentResources)
_BUILD_HISTORY = constructor(History)
_BUILD_LEVELS = constructor(LineLevels)

#: Groups whose recommendations `predict` draws at once: its (groups x horizon steps) arrays, a dozen at 288 steps,
#: stay near 5 MB each whatever the fleet's size (for 100,000 containers they were 230 MB each).
_PREDICT_ROWS = 2048


@dataclass(frozen=True)
class _Block:
    """A block of the groups `predict` draws at once: `everyone[rows]`. What is read of every fitted group (the
    histograms' percentiles, the forecasts' lines, where each group is in a fitted table) is computed once, in
    `memo`, for all the blocks."""

    everyone: pd.Index
    rows: slice
    memo: dict[str, Any]

    @property
    def groups(self) -> pd.Index:
        return self.everyone[self.rows]

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def positions(self, fitted: Any) -> IntArray:
        """Where each group of the block is in `fitted` (a fitted table's groups), -1 where it is not: found once per
        array for all the blocks (the memo holds the array, so its id names no other while the memo lives), and
        without a lookup when the table has every group in order (a live pass's tables mostly do: the histograms',
        the grids' and the workloads' groups are one list)."""
        key = f"positions.{id(fitted)}"
        if key not in self.memo:
            everyone = self.once("everyone", lambda: np.asarray(self.everyone, dtype=object))
            labels = np.asarray(fitted, dtype=object)
            same = labels.shape == everyone.shape and bool((labels == everyone).all())
            found = np.arange(len(everyone), dtype=np.intp) if same else pd.Index(fitted).get_indexer(self.everyone)
            self.memo[key] = (fitted, found)
        everywhere: IntArray = self.memo[key][1]
        return everywhere[self.rows]

    def aligned(self, key: str, values: Callable[[], FloatArray], fitted: Any) -> FloatArray:
        """`values()` (one per group of `fitted`, computed once and named `key`) for the block's groups: NaN where a
        group has none."""
        index = self.positions(fitted)
        computed: FloatArray = self.once(key, values)
        result: FloatArray = np.full(index.size, np.nan)
        result[index >= 0] = computed[index[index >= 0]]
        return result


class _SpareColumns:
    """The wider arrays behind the usage grids `_slide_in_place` moves: a grid is a window of its array's columns,
    and a pass moves the window, not the values. Only arrays made here are moved within (found by the window's
    `base`), so a live grid of any other origin, a checkpoint's or a copy's, gets an array of its own at its first
    move (for a moment, the grid twice: at 10,000 containers 320 MB more, once per resource after a resume); a
    training moves its grid in place. A pickle or a copy of a window holds the window's values only."""

    #: Spare columns after a grid's window: a day of 5-minute steps, so the values move once a day (7 % of a
    #: 14-day grid's memory).
    columns = 288
    #: Rows moved at once when the window goes back (the temporary: 256 x 4,320 steps x 8 B = 9 MB).
    rows = 256

    def __init__(self) -> None:
        self._made: weakref.WeakValueDictionary[int, FloatArray] = weakref.WeakValueDictionary()

    def moved(self, grid: FloatArray, shift: int, spare: bool) -> FloatArray:
        """`grid`'s values `shift` columns earlier, the columns that enter NaN (0 < shift <= width): its window
        moved when it is one made here, else a new window over a new wider array (`spare`) or `grid` itself."""
        width = grid.shape[1]
        # Alive arrays have distinct ids, and one made here leaves `_made` as it dies: found, it is `grid.base`.
        wide = self._made.get(id(grid.base))
        if wide is not None:
            start = (grid.ctypes.data - wide.ctypes.data) // grid.itemsize + shift
            if start + width > wide.shape[1]:
                start = 0
                self._copy(wide, grid[:, shift:])
            moved: FloatArray = wide[:, start : start + width]
        elif spare:
            wide = np.empty((grid.shape[0], width + self.columns))
            self._made[id(wide)] = wide
            self._copy(wide, grid[:, shift:])
            moved = wide[:, :width]
        else:
            self._copy(grid, grid[:, shift:])
            moved = grid
        moved[:, width - shift :] = np.nan
        return moved

    def _copy(self, to: FloatArray, columns: FloatArray) -> None:
        """`columns` to the first columns of `to`, by blocks of rows (numpy copies a block that overlaps its
        destination through a temporary of the block's size)."""
        for first in range(0, to.shape[0], self.rows):
            to[first : first + self.rows, : columns.shape[1]] = columns[first : first + self.rows]


_SPARE = _SpareColumns()
#: The columns of `workloads_` a recommendation's identity and history are made of (`predict`).
_DESCRIBED_COLUMNS = (
    "namespace", "workload", "container", "first_sample", "last_sample", "pods", "replicas", "samples",
    "cpu_samples", "memory_samples",
)  # fmt: skip
#: The request line's forecaster is the `request` attribute of ResourceForecast; the JSON calls that line target.
_FORECAST_LINE = {"target": "request", "short_term": "short_term", "long_term": "long_term"}
