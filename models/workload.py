"""The composite estimator: everything we learn about a fleet of workload containers from tidy usage.

`WorkloadRecommender.fit(usage)` takes a tidy usage frame (the columns of the shared data format) and fits, per
(namespace, workload, container) with pods pooled:
- VPA's CPU histogram and memory-peak histogram (request target and bounds),
- Koordinator's mid rule for the long-term reservation,
- the seasonal-max short-term reservation (and, from it, the peak forecast).
`predict(as_of, horizon_seconds)` turns them into a `RecommendationSet`, the JSON contract of the project.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from models._validation import require_columns
from models.ensemble import (
    CONSTANT_FORECASTERS,
    PeakForecaster,
    SelectedForecaster,
    candidate_lines,
    constant_candidates,
    history_summary,
    merge_sketches,
    model_name,
    rolling_origins,
    selected_forecaster,
    short_term_candidates,
    usage_after,
)
from models.forecast import STEPS_PER_DAY, nan_quantile, usage_grid
from models.histogram import DecayingHistogram, MemoryPeakHistogram
from models.reservation import PercentileReservation, SeasonalMaxReservation, peak_of
from models.vpa import VpaRecommender
from recommender.arrays import FloatArray, IntArray
from recommender.identity import KEY_COLUMNS
from recommender.policy import RequestBounds, request_bounds, request_policy_for, with_target
from recommender.resources import (
    CurrentResources,
    History,
    LineLevels,
    LineModels,
    LineQuality,
    Peak,
    RecommendationSet,
    ResourceRecommendation,
    WorkloadRecommendation,
)
from recommender.settings import ForecastSettings, HistogramSettings, PolicySettings, ReservationSettings

USAGE_COLUMNS = ("timestamp", "namespace", "workload", "pod", "container", "cpu_cores", "memory_bytes")
#: Per resource, the pod-state column counting its known samples (`PolicySettings.min_samples` reads it).
SAMPLE_COLUMNS = {"cpu_samples": "cpu_cores", "memory_samples": "memory_bytes"}
CURRENT_COLUMNS = (
    "cpu_request_cores",
    "cpu_limit_cores",
    "memory_request_bytes",
    "memory_limit_bytes",
    "cpu_throttled_fraction",
)


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
        for model in (self.short_term, self.request, self.long_term):
            model.summary_ = history_summary(grid, model.recent_steps)
        recent = grid[:, -self.request.recent_steps :]
        floor = nan_quantile(recent, 1.0 - self.request.target_violation) if recent.shape[1] else None
        return replace(self, recent_end=grid_end, request_floor=floor)

    def quality(self, model: SelectedForecaster, group: int) -> LineQuality:
        """The chosen candidate's rolling-origin cost for a group, the best other cost, and the calibration factor."""
        costs = model.costs_[:, group]
        choice = int(model.choice_[group])
        others = np.delete(costs, choice)
        others = others[np.isfinite(others)]
        # Six significant digits: the costs' last bits depend on how many containers were scored together (numpy's
        # summation order), and a distributed run must give the same JSON as one process.
        fleet = model.fleet_costs_[choice, 0]
        return LineQuality(
            cost=_significant(costs[choice]) if np.isfinite(costs[choice]) else None,
            next_best_cost=_significant(others.min()) if others.size else None,
            fleet_overprovision=_significant(fleet) if np.isfinite(fleet) else None,
            calibration_factor=float(model.factors_[group]),
        )

    def describe(self, model: SelectedForecaster, group: int, names: list[str]) -> str:
        """Name of the candidate `model` chose for a group (`names`: its `model_names()`, computed once per line: a
        scikit-learn repr costs milliseconds), with its rolling-origin cost and calibration factor."""
        choice = int(model.choice_[group])
        cost = model.costs_[choice, group]
        scored = f"cost={cost:.3g}" if np.isfinite(cost) else "not yet backtested"
        return f"{names[choice]} {scored} x{model.factors_[group]:.3g}"


Sketch = tuple[IntArray, IntArray]
LINES = ("short_term", "request", "long_term")
#: A pod counts as a current replica when its newest sample is at most this much older than its workload's newest,
#: seconds: three 5-minute steps, so one missed scrape does not drop it and a pod replaced an hour ago is not counted.
REPLICA_WINDOW_SECONDS = 900
#: The long-term line holds for a week: its candidates are scored on the week after each origin.
LONG_TERM_DAYS = 7


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
    line built for its risk level in `settings`.

    Memory follows the work, not candidates x origins x containers x steps: only containers with a day of samples
    are backtested and fitted (a newer one's line is its cold start, `finish_line`), a constant candidate's past
    lines are one value per origin and container, a candidate shared by several lines is backtested once, and only
    the chosen candidates are fitted."""
    per_day = STEPS_PER_DAY
    rows = np.flatnonzero(np.sum(~np.isnan(grid), axis=1) >= per_day)
    scored = grid[rows]
    origins = rolling_origins(grid.shape[1], settings.selection_days, per_day)
    usage = usage_after(scored, origins, LONG_TERM_DAYS * per_day)
    past: dict[str, FloatArray] = {}
    fitted: dict[str, BaseEstimator] = {}

    def backtest(candidates: list[BaseEstimator]) -> list[FloatArray]:
        out = []
        for candidate in candidates:
            key = model_name(candidate)
            if key not in past:
                past[key] = candidate_lines(
                    scored, candidate, origins, per_day, isinstance(candidate, CONSTANT_FORECASTERS)
                )
            out.append(past[key])
        return out

    def fit_scored(candidates: list[BaseEstimator]) -> Callable[[int], BaseEstimator]:
        def fit(m: int) -> BaseEstimator:
            key = model_name(candidates[m])
            if key not in fitted:
                fitted[key] = clone(candidates[m]).fit(scored)
            return fitted[key]

        return fit

    short, request, long = (settings.target_for(line) for line in LINES)
    models = []
    for target, candidates, constant, days in (
        (short, short_term_candidates(settings, short), False, 1),
        (request, constant_candidates(settings, request), True, 1),
        (long, constant_candidates(settings, long), True, LONG_TERM_DAYS),
    ):
        selector = selected_forecaster(settings, candidates, target, constant, days)
        lines = backtest(candidates)
        models.append(selector.fit_lines(grid, lines, usage[:, :, : days * per_day], fit_scored(candidates), rows=rows))
    return ResourceForecast(
        short_term=models[0],
        request=models[1],
        long_term=models[2],
        peak=PeakForecaster(selection_days=settings.selection_days, quantile=settings.peak_quantile).fit(grid),
        grid_end=grid_end,
    )


def level_key(settings: ForecastSettings, label: str) -> str:
    """The risk levels of a group's three lines as a key, `"short/request/long"`: an override for its workload
    (`namespace/workload`) or namespace, else the settings' per-line levels."""
    namespace, workload, _ = json.loads(label)
    override = settings.target_violation_overrides
    level = override.get(f"{namespace}/{workload}", override.get(namespace))
    levels = [level] * 3 if level is not None else [settings.target_for(line) for line in LINES]
    return "/".join(f"{value:g}" for value in levels)


def parse_level_key(key: str) -> tuple[float, ...]:
    return tuple(float(part) for part in key.split("/"))


def _buckets(hist: HistogramSettings, resource: str) -> dict[str, float]:
    """VPA's bucket layout and empty-bucket threshold of one resource, as histogram estimator parameters."""
    first, top = (
        (hist.cpu_first_bucket_cores, hist.cpu_max_cores)
        if resource == "cpu"
        else (hist.memory_first_bucket_bytes, hist.memory_max_bytes)
    )
    return {
        "first_bucket_size": first,
        "max_value": top,
        "bucket_growth_ratio": hist.bucket_growth_ratio,
        "epsilon": hist.epsilon,
    }


def vpa_estimator(hist: HistogramSettings, policy: PolicySettings) -> VpaRecommender:
    """The `vpa` request policy's estimator with these settings (VPA's own defaults unless overridden)."""
    return VpaRecommender(
        cpu_first_bucket_cores=hist.cpu_first_bucket_cores,
        cpu_max_cores=hist.cpu_max_cores,
        memory_first_bucket_bytes=hist.memory_first_bucket_bytes,
        memory_max_bytes=hist.memory_max_bytes,
        bucket_growth_ratio=hist.bucket_growth_ratio,
        epsilon=hist.epsilon,
        cpu_half_life_seconds=hist.cpu_half_life_seconds,
        memory_half_life_seconds=hist.memory_half_life_seconds,
        cpu_sample_weight=hist.cpu_sample_weight,
        memory_peak_weight=hist.memory_peak_weight,
        memory_aggregation_interval_seconds=hist.memory_aggregation_interval_seconds,
        memory_aggregation_interval_count=hist.memory_aggregation_interval_count,
        oom_min_bump_bytes=hist.oom_min_bump_bytes,
        oom_bump_ratio=hist.oom_bump_ratio,
        target_percentile=policy.target_percentile,
        lower_bound_percentile=policy.lower_bound_percentile,
        upper_bound_percentile=policy.upper_bound_percentile,
        safety_margin_fraction=policy.safety_margin_fraction,
        lower_bound_confidence_multiplier=policy.lower_bound_confidence_multiplier,
        lower_bound_confidence_exponent=policy.lower_bound_confidence_exponent,
        upper_bound_confidence_multiplier=policy.upper_bound_confidence_multiplier,
        upper_bound_confidence_exponent=policy.upper_bound_confidence_exponent,
        confidence_interval_seconds=policy.confidence_interval_seconds,
        pod_min_cpu_cores=policy.pod_min_cpu_cores,
        pod_min_memory_bytes=policy.pod_min_memory_bytes,
    )


class WorkloadRecommender(BaseEstimator):  # type: ignore[misc]
    """Histogram models and reservation lines for every workload container of a tidy usage frame."""

    def __init__(
        self,
        histogram: HistogramSettings | None = None,
        policy: PolicySettings | None = None,
        reservation: ReservationSettings | None = None,
        forecast: ForecastSettings | None = None,
    ) -> None:
        self.histogram = histogram
        self.policy = policy
        self.reservation = reservation
        self.forecast = forecast

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Models stored before OOM kills were counted kept only which groups had one: each counts as one kill.
        if "oom_groups_" in state:
            groups = state.pop("oom_groups_")
            state["oom_kills_"] = pd.Series(1, index=pd.Index(groups, dtype=object), dtype=np.int64)
        # Models stored before per-resource sample counts: every sample of a pod counted for both resources.
        for name in ("pods_", "workloads_"):
            if name in state and "cpu_samples" not in state[name].columns:
                state[name] = state[name].assign(**dict.fromkeys(SAMPLE_COLUMNS, state[name]["samples"]))
        super().__setstate__(state)

    def fit(
        self, X: pd.DataFrame, y: Any = None, oom_events: pd.DataFrame | None = None, data_end: int | None = None
    ) -> Self:
        """Learn from tidy usage rows; `oom_events` (timestamp, namespace, workload, pod, container and optionally
        memory_bytes at the kill) bumps the memory histogram as VPA does. `data_end`: the fleet's newest sample when
        X is one partition of it, so every partition's forecast grid ends at the same step (default: X's newest)."""
        require_columns(X, USAGE_COLUMNS, type(self).__name__)
        if len(X) == 0:
            raise ValueError("no usage rows to learn from")
        hist = self.histogram or HistogramSettings()
        res = self.reservation or ReservationSettings()
        usage = with_group_labels(X)
        cpu = usage[["group", "pod", "timestamp"]].assign(value=usage["cpu_cores"])
        memory = usage[["group", "pod", "timestamp"]].assign(value=usage["memory_bytes"])

        self.cpu_histogram_ = DecayingHistogram(
            **_buckets(hist, "cpu"),
            half_life_seconds=hist.cpu_half_life_seconds,
            sample_weight=hist.cpu_sample_weight,
        ).fit(cpu)
        self.memory_histogram_ = MemoryPeakHistogram(
            **_buckets(hist, "memory"),
            half_life_seconds=hist.memory_half_life_seconds,
            peak_weight=hist.memory_peak_weight,
            interval_seconds=hist.memory_aggregation_interval_seconds,
            interval_count=hist.memory_aggregation_interval_count,
            oom_min_bump_bytes=hist.oom_min_bump_bytes,
            oom_bump_ratio=hist.oom_bump_ratio,
        ).fit(memory, oom_events=(oom_frame := self._oom_frame(oom_events, usage)))
        # Usage under-reports what an OOM-killed container needed: its memory target never drops below VPA's bumped one.
        self.oom_kills_ = _oom_counts(oom_frame)
        self.cpu_long_term_ = PercentileReservation(
            percentile=res.long_term_cpu_percentile,
            margin_fraction=res.long_term_margin_fraction,
            half_life_seconds=res.long_term_cpu_half_life_seconds,
            **_buckets(hist, "cpu"),
        ).fit(cpu)
        self.memory_long_term_ = PercentileReservation(
            percentile=res.long_term_memory_percentile,
            margin_fraction=res.long_term_margin_fraction,
            half_life_seconds=res.long_term_memory_half_life_seconds,
            **_buckets(hist, "memory"),
        ).fit(memory)
        short_term = SeasonalMaxReservation(
            step_seconds=res.step_seconds,
            recent_window_seconds=res.recent_window_seconds,
            seasonal_days=res.seasonal_days,
            slot_tolerance_seconds=res.slot_tolerance_seconds,
        )
        self.cpu_short_term_ = short_term.fit(cpu)
        self.memory_short_term_ = SeasonalMaxReservation(**short_term.get_params()).fit(memory)
        self.pods_ = self._pods(usage)
        self.workloads_ = self._describe(self.pods_)
        self.vpa_ = vpa_estimator(hist, self.policy or PolicySettings())
        self.vpa_.fit(*self._vpa_input(usage, oom_events))
        self.sample_steps_ = self._sample_steps(usage)
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
        del usage, cpu, memory, oom_frame
        self._fit_forecasts()
        return self

    def partial_fit(self, X: pd.DataFrame, y: Any = None, oom_events: pd.DataFrame | None = None) -> Self:
        """Continue from the learned state with samples newer than those seen: the decaying histograms come out as
        one fit on all the data would make them, so a daily run reads one day, not the whole history."""
        if not hasattr(self, "workloads_"):
            return self.fit(X, oom_events=oom_events)
        require_columns(X, USAGE_COLUMNS, type(self).__name__)
        if len(X) == 0:
            return self
        self._continue(X, oom_events, new_forecast_groups=True)
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
        self._continue(X, oom_events, new_forecast_groups=False)
        for name, grid in (("cpu_forecasts_", self.cpu_grid_), ("memory_forecasts_", self.memory_grid_)):
            forecasts: dict[str, ResourceForecast] = getattr(self, name)
            setattr(self, name, {key: f.following(grid, self.grid_end_) for key, f in forecasts.items()})
        return self

    def _continue(self, X: pd.DataFrame, oom_events: pd.DataFrame | None, new_forecast_groups: bool) -> None:
        """Everything of `partial_fit` but the forecasts' refit; `new_forecast_groups`: let groups that now have
        enough samples into the grid (only a refit can draw their lines)."""
        usage = with_group_labels(X)
        cpu = usage[["group", "pod", "timestamp"]].assign(value=usage["cpu_cores"])
        memory = usage[["group", "pod", "timestamp"]].assign(value=usage["memory_bytes"])
        self.cpu_histogram_.partial_fit(cpu)
        self.memory_histogram_.partial_fit(memory, oom_events=self._oom_frame(oom_events, usage))
        self.cpu_long_term_.partial_fit(cpu)
        self.memory_long_term_.partial_fit(memory)
        self.cpu_short_term_.partial_fit(cpu)
        self.memory_short_term_.partial_fit(memory)
        self.pods_ = self._merge_pods(self.pods_, self._pods(usage))
        self.workloads_ = self._describe(self.pods_)
        if not hasattr(self, "vpa_"):
            self.vpa_ = vpa_estimator(self.histogram or HistogramSettings(), self.policy or PolicySettings())
        self.vpa_.partial_fit(*self._vpa_input(usage, oom_events))
        if len(usage) > 1:
            self.sample_steps_ = self._sample_steps(usage)
            self.sample_interval_seconds_ = median_of_counts(*self.sample_steps_, default=60.0)
        self.data_end_ = max(self.data_end_, int(usage["timestamp"].max()))
        self.oom_kills_ = self.oom_kills_.add(_oom_counts(self._oom_frame(oom_events, usage)), fill_value=0).astype(
            np.int64
        )
        # The forecast models' grid slides to the new end and takes the new samples (then they are refitted on it).
        old_groups = pd.Index(self.forecast_groups_)
        groups = (
            old_groups.append(self._forecast_groups(pd.Index(usage["group"].cat.categories.astype(str)))).unique()
            if new_forecast_groups
            else old_groups
        )
        end = self._grid_end()
        step = (self.reservation or ReservationSettings()).step_seconds
        shift = max(int((end - self.grid_end_) // step), 0)
        self.grid_end_ = end
        width = self._grid_steps(groups)
        for name, column in (("cpu_grid_", "cpu_cores"), ("memory_grid_", "memory_bytes")):
            old = getattr(self, name)
            slid = np.full((len(groups), width), np.nan)
            # Old column j is new column j + offset: both grids end at their grid end, the new one `shift` later.
            offset = width - old.shape[1] - shift
            first = max(0, -offset)
            if first < old.shape[1]:
                slid[: len(old_groups), first + offset : old.shape[1] + offset] = old[:, first:]
            setattr(self, name, np.fmax(slid, self._usage_grid(usage, column, groups)))
        self.forecast_groups_ = np.asarray(groups, dtype=str)

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
        """The groups of `groups` with `policy.min_samples` samples of a resource: only these are forecast, so memory
        and time follow the containers that can get a recommendation (a group that crosses the minimum in a later
        `partial_fit` enters the grid with the samples from then on)."""
        policy = self.policy or PolicySettings()
        counts = self.workloads_.reindex(groups)[list(SAMPLE_COLUMNS)].fillna(0).max(axis=1)
        return groups[counts.to_numpy() >= policy.min_samples]

    def _grid_end(self) -> int:
        """End of the forecast grid: the step after the newest sample."""
        step = (self.reservation or ReservationSettings()).step_seconds
        return (self.data_end_ // step + 1) * step

    def _grid_steps(self, groups: pd.Index) -> int:
        """Width of the forecast grid: the last selection + history days before `grid_end_`, cut to the whole days
        since the first sample of `groups` (a fleet with an hour of history needs a day of columns, not 22)."""
        settings = self.forecast or ForecastSettings()
        per_day = 86400 // (self.reservation or ReservationSettings()).step_seconds
        first = self.workloads_["first_sample"].reindex(groups).min() if len(groups) else np.nan
        span_days = int(np.ceil((self.grid_end_ - first) / 86400)) if np.isfinite(first) else 1
        return min(settings.selection_days + settings.history_days + 1, max(span_days, 1)) * per_day

    def _usage_grid(self, usage: pd.DataFrame, column: str, groups: pd.Index) -> FloatArray:
        """Per-step maxima (pods pooled) over `_grid_steps` before `grid_end_`, rows in `groups` order."""
        step = (self.reservation or ReservationSettings()).step_seconds
        codes = groups.get_indexer(usage["group"].cat.categories.astype(str))[usage["group"].cat.codes.to_numpy()]
        return usage_grid(
            codes.astype(np.int64),
            usage["timestamp"].to_numpy(dtype=np.float64),
            usage[column].to_numpy(dtype=np.float64),
            len(groups),
            self.grid_end_,
            self._grid_steps(groups),
            step,
        )

    def _fit_forecasts(self) -> None:
        """One forecast per resource and distinct set of risk levels (the default, and each override in use), each on
        the whole fleet's grid: the fleet chooses and calibrates at that level, its containers take the lines."""
        settings = self.forecast or ForecastSettings()
        self.group_levels_ = np.asarray([level_key(settings, label) for label in self.forecast_groups_], dtype=object)
        self.cpu_forecasts_: dict[str, ResourceForecast] = {}
        self.memory_forecasts_: dict[str, ResourceForecast] = {}
        if not settings.enabled:
            return
        # CPU and memory in two threads: the work is numpy sorting, which releases the GIL (1.7x on 2 cores).
        with ThreadPoolExecutor(max_workers=2) as pool:
            for key in sorted(set(self.group_levels_.tolist())):
                levels = settings.model_copy(
                    update=dict(zip((f"{line}_target_violation" for line in LINES), parse_level_key(key)))
                )
                cpu = pool.submit(fit_resource_forecast, self.cpu_grid_, levels, self.grid_end_)
                memory = pool.submit(fit_resource_forecast, self.memory_grid_, levels, self.grid_end_)
                self.cpu_forecasts_[key], self.memory_forecasts_[key] = cpu.result(), memory.result()

    def vpa_groups(self, labels: Any) -> npt.NDArray[np.bool_]:
        """Which of these group labels the `vpa` request policy sizes (`policy.request_policy` and its rules)."""
        policy = self.policy or PolicySettings()
        if not policy.request_policy_rules:
            return np.full(len(labels), policy.request_policy == "vpa")
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
        rows = usage[chosen[usage["group"].cat.codes.to_numpy()]] if not chosen.all() else usage
        columns = ["group", "pod", "timestamp", "cpu_cores", "memory_bytes"]
        samples = rows[columns].assign(group=rows["group"].astype(str))
        if oom_events is None or len(oom_events) == 0 or not chosen.any():
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

    @staticmethod
    def _oom_frame(oom_events: pd.DataFrame | None, usage: pd.DataFrame) -> pd.DataFrame | None:
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

    @staticmethod
    def _pods(usage: pd.DataFrame) -> pd.DataFrame:
        """Per (group, pod): first and last sample, sample count, and the last requests/limits it reported."""
        ordered = usage.sort_values("timestamp", kind="stable")
        grouped = ordered.groupby([ordered["group"].astype(str), "pod"], sort=False)
        pods: pd.DataFrame = (
            grouped["timestamp"]
            .agg(["min", "max", "size"])
            .set_axis(["first_sample", "last_sample", "samples"], axis=1)
        )
        pods = pods.join(grouped[list(SAMPLE_COLUMNS.values())].count().set_axis(list(SAMPLE_COLUMNS), axis=1))
        present = [c for c in CURRENT_COLUMNS if c in usage.columns]
        if present:
            pods = pods.join(grouped[present].last())
        for column in CURRENT_COLUMNS:
            if column not in pods.columns:
                pods[column] = np.nan
        pods.index = pods.index.set_names(["group", "pod"])
        return pods

    @staticmethod
    def _merge_pods(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
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

    @staticmethod
    def _describe(pods: pd.DataFrame) -> pd.DataFrame:
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

    @staticmethod
    def _sample_steps(usage: pd.DataFrame) -> Sketch:
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

    def predict(self, as_of: int | None = None, horizon_seconds: int = 86400) -> RecommendationSet:
        """Recommendations for every learned workload container at decision time `as_of` (default: data end)."""
        check_is_fitted(self, "workloads_")
        policy = self.policy or PolicySettings()
        step = self.cpu_short_term_.step_seconds
        decision = int(self.data_end_ + 1 if as_of is None else as_of)
        described = self.workloads_
        groups = described.index
        confidence = self._confidence_days(groups)
        per_pod = described["containers_per_pod"].to_numpy(dtype=np.float64)
        cpu = self._resource(
            self.cpu_histogram_,
            self.cpu_long_term_,
            self.cpu_short_term_,
            self.cpu_forecasts_,
            groups,
            decision,
            horizon_seconds,
            _sizer(
                confidence,
                per_pod,
                policy.pod_min_cpu_cores,
                policy.min_allowed_cpu_cores,
                policy.max_allowed_cpu_cores,
                policy,
            ),
        )
        memory = self._resource(
            self.memory_histogram_,
            self.memory_long_term_,
            self.memory_short_term_,
            self.memory_forecasts_,
            groups,
            decision,
            horizon_seconds,
            _sizer(
                confidence,
                per_pod,
                policy.pod_min_memory_bytes,
                policy.min_allowed_memory_bytes,
                policy.max_allowed_memory_bytes,
                policy,
            ),
        )
        vpa_cpu, vpa_memory = self._vpa_bounds(groups, per_pod, decision)
        now = {c: described[c].to_numpy(dtype=np.float64) for c in CURRENT_COLUMNS}
        cpu_range, memory_range = (
            (policy.min_allowed_cpu_cores, policy.max_allowed_cpu_cores),
            (policy.min_allowed_memory_bytes, policy.max_allowed_memory_bytes),
        )
        cpu = [
            _with_vpa(rec, vpa_cpu, i, cpu_range, now["cpu_request_cores"][i], now["cpu_limit_cores"][i])
            for i, rec in enumerate(cpu)
        ]
        memory = [
            _with_vpa(rec, vpa_memory, i, memory_range, now["memory_request_bytes"][i], now["memory_limit_bytes"][i])
            for i, rec in enumerate(memory)
        ]
        recent_cpu = self._recent(self.cpu_short_term_, groups, decision, cpu)
        recent_memory = self._recent(self.memory_short_term_, groups, decision, memory)
        out = []
        for i, (label, row) in enumerate(described.iterrows()):
            current = {c: (None if pd.isna(row[c]) else float(row[c])) for c in CURRENT_COLUMNS}
            out.append(
                WorkloadRecommendation(
                    namespace=row["namespace"],
                    workload=row["workload"],
                    container=row["container"],
                    cpu=cpu[i],
                    memory=memory[i],
                    current=CurrentResources(**current),
                    history=History(
                        first_sample=int(row["first_sample"]),
                        last_sample=int(row["last_sample"]),
                        pods=int(row["pods"]),
                        replicas=int(row["replicas"]),
                        samples=int(row["samples"]),
                        cpu_samples=int(row["cpu_samples"]),
                        memory_samples=int(row["memory_samples"]),
                        oom_kills=int(self.oom_kills_.get(label, 0)),
                        recent_cpu_cores=recent_cpu[i],
                        recent_memory_bytes=recent_memory[i],
                    ),
                )
            )
        return RecommendationSet(
            as_of=decision, horizon_seconds=horizon_seconds, step_seconds=step, recommendations=out
        )

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
            cpu, memory = self._vpa_bounds(groups, per_pod, as_of)
        finally:
            vpa.initial_.pop(label, None)
        policy = self.policy or PolicySettings()
        now = {c: float(described[c].iloc[0]) for c in CURRENT_COLUMNS}
        return rec.model_copy(
            update={
                "cpu": _with_vpa(
                    rec.cpu,
                    cpu,
                    0,
                    (policy.min_allowed_cpu_cores, policy.max_allowed_cpu_cores),
                    now["cpu_request_cores"],
                    now["cpu_limit_cores"],
                ),
                "memory": _with_vpa(
                    rec.memory,
                    memory,
                    0,
                    (policy.min_allowed_memory_bytes, policy.max_allowed_memory_bytes),
                    now["memory_request_bytes"],
                    now["memory_limit_bytes"],
                ),
            }
        )

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

    def _confidence_days(self, groups: pd.Index) -> FloatArray:
        """VPA's confidence: min(history length, samples x sample interval), in days, per group."""
        hist = self.cpu_histogram_
        index = pd.Index(hist.groups_).get_indexer(groups)
        span = np.where(index >= 0, hist.history_days()[index], 0.0)
        count = np.where(index >= 0, hist.sample_count_[index], 0)
        covered = count * self.sample_interval_seconds_ / 86400.0
        result: FloatArray = np.minimum(span, covered)
        return result

    @staticmethod
    def _aligned(values: FloatArray, fitted_groups: Any, groups: pd.Index) -> FloatArray:
        index = pd.Index(fitted_groups).get_indexer(groups)
        result: FloatArray = np.full(len(groups), np.nan)
        result[index >= 0] = values[index[index >= 0]]
        return result

    def _forecast_lines(
        self, forecasts: dict[str, ResourceForecast], groups: pd.Index, as_of: int, horizon_seconds: int, step: int
    ) -> dict[str, Any]:
        """Per group (in `groups` order): our short-term line, request, long-term and peak values from the forecast of
        its risk levels (NaN where a forecast drew none, e.g. stale), the levels, and per line the model's name and
        quality."""
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
        own = pd.Index(self.forecast_groups_).get_indexer(groups)
        keys = np.full(len(groups), None, dtype=object)
        keys[own >= 0] = self.group_levels_[own[own >= 0]]
        for key, forecast in forecasts.items():
            rows = np.flatnonzero(keys == key)
            if rows.size == 0:
                continue
            short, request, long_term = (line[own[rows]] for line in forecast.lines(as_of, horizon_seconds, step))
            out["short_term"][rows], out["request"][rows], out["long_term"][rows] = short, request, long_term
            out["peak"][rows] = forecast.peak.predict()[own[rows]]
            # Steps without a sample up to the decision time, not only to the data's end: a model used days later
            # (or a decision long after the last row) must not call a silent container fresh.
            late = max(int((as_of - (forecast.recent_end or forecast.grid_end)) // step), 0)
            out["stale"][rows] = forecast.short_term.summary_[own[rows], 3] + late >= forecast.short_term.stale_steps
            names = {line: getattr(forecast, line).model_names() for line in LINES}
            levels = parse_level_key(key)
            for row in rows:
                group = own[row]
                out["levels"][row] = LineLevels(short_term=levels[0], target=levels[1], long_term=levels[2])
                for line, field in _FORECAST_LINE.items():
                    model = getattr(forecast, field)
                    out["names"][row][line] = forecast.describe(model, group, names[field])
                    out["quality"][row][line] = forecast.quality(model, group)
                out["names"][row]["peak"] = forecast.peak.name()
        return out

    def _resource(
        self,
        histogram: DecayingHistogram | MemoryPeakHistogram,
        long_term: PercentileReservation,
        short_term: SeasonalMaxReservation,
        forecasts: dict[str, ResourceForecast],
        groups: pd.Index,
        as_of: int,
        horizon_seconds: int,
        bounds: Any,
    ) -> list[ResourceRecommendation | None]:
        """Our forecast lines where the models have data; the foundation's rules (named as such) elsewhere. A stale
        group (no sample for `stale_after_seconds`) holds VPA's request flat on every line and says so."""
        policy = self.policy or PolicySettings()
        settings = self.forecast or ForecastSettings()
        fitted = histogram.groups_
        lower, target, upper = (
            self._aligned(histogram.quantile(q), fitted, groups)
            for q in (policy.lower_bound_percentile, policy.target_percentile, policy.upper_bound_percentile)
        )
        step = short_term.step_seconds
        ours = self._forecast_lines(forecasts, groups, as_of, horizon_seconds, step)
        ours_request = ours["request"]
        memory = histogram is self.memory_histogram_
        oom = np.isin(np.asarray(groups, dtype=str), self.oom_kills_.index)
        if memory:
            ours_request = np.where(oom, np.nan, ours_request)
        sized = bounds(lower, target, upper, ours_request)
        sized_target = sized.target
        peak_bound = np.full(len(groups), np.nan)
        if memory:
            # A small fleet must not inflate memory: without an OOM kill, the request stays within the week's peak
            # x (1 + margin), and a limit we set never goes below that peak x (1 + margin) (`limit_floor`).
            peak_bound = self._observed_peak(groups) * (1.0 + settings.memory_peak_margin_fraction)
            capped = np.where(~oom & np.isfinite(peak_bound), np.fmin(sized_target, peak_bound), sized_target)
            sized_target = capped
        long_values = self._aligned(long_term.predict(), long_term.groups_, groups)
        has_line = ~np.isnan(ours["short_term"]).any(axis=1)
        current = self.workloads_.reindex(groups)
        # No recommendation from too few samples: an empty histogram reads as the pod minimum, not as "unknown".
        known = current["memory_samples" if memory else "cpu_samples"].to_numpy(dtype=np.float64)
        enough = known >= policy.min_samples
        # The foundation's line only where ours is missing (and a recommendation will be made).
        lines = ours["short_term"].copy()
        position = pd.Index(short_term.groups_).get_indexer(groups)
        needed = np.flatnonzero(~has_line & enough & (position >= 0))
        lines[needed] = short_term.predict(as_of, horizon_seconds, rows=position[needed])
        long_values = np.where(np.isnan(ours["long_term"]), long_values, ours["long_term"])
        stale = ours["stale"]
        lines = np.where(stale[:, None], sized_target[:, None], lines)
        long_values = np.where(stale, sized_target, long_values)
        line_peak, peak_times = peak_of(lines, as_of, short_term.step_seconds)
        peak_values = np.where(np.isnan(ours["peak"]) | stale, line_peak, ours["peak"])
        request_now = current["memory_request_bytes" if memory else "cpu_request_cores"].to_numpy(dtype=np.float64)
        limit_now = current["memory_limit_bytes" if memory else "cpu_limit_cores"].to_numpy(dtype=np.float64)
        result: list[ResourceRecommendation | None] = []
        for i in range(len(groups)):
            if np.isnan(target[i]) or not enough[i]:
                result.append(None)
                continue
            drawn = {
                "target": ours_request[i],
                "short_term": 0.0 if has_line[i] else np.nan,
                "long_term": ours["long_term"][i],
            }
            names = ours["names"][i]
            limit, rule = recommended_limit(float(sized_target[i]), request_now[i], limit_now[i], float(peak_bound[i]))
            result.append(
                ResourceRecommendation(
                    target=float(sized_target[i]),
                    lower_bound=float(min(sized.lower_bound[i], sized_target[i])),
                    upper_bound=float(max(sized.upper_bound[i], sized_target[i])),
                    uncapped_target=float(sized.uncapped_target[i]),
                    short_term=lines[i].tolist(),
                    long_term=float(long_values[i]),
                    peak=Peak(value=float(peak_values[i]), at=int(peak_times[i])),
                    levels=ours["levels"][i],
                    stale=bool(stale[i]),
                    limit=limit,
                    limit_rule=rule,
                    limit_floor=float(peak_bound[i]) if np.isfinite(peak_bound[i]) else None,
                    models=LineModels(
                        target=names["target"] if not np.isnan(drawn["target"]) else "VPA histogram",
                        short_term="stale: the request held flat"
                        if stale[i]
                        else names["short_term"]
                        if has_line[i]
                        else "SeasonalMaxReservation",
                        long_term=names["long_term"] if not np.isnan(drawn["long_term"]) else "Koordinator mid",
                        peak=names.get("peak", "max of the short-term line")
                        if not stale[i]
                        else "max of the short-term line",
                        quality={line: q for line, q in ours["quality"][i].items() if not np.isnan(drawn[line])},
                    ),
                )
            )
        return result

    def _observed_peak(self, groups: pd.Index) -> FloatArray:
        """Max memory (pods pooled) of the last 7 days of the forecast grid per group; NaN where none."""
        window = self.memory_grid_[:, -7 * STEPS_PER_DAY :]
        with np.errstate(all="ignore"):
            peak = (
                np.where(np.isnan(window), -np.inf, window).max(axis=1)
                if window.shape[1]
                else np.full(window.shape[0], -np.inf)
            )
        values = self._aligned(peak, self.forecast_groups_, groups)
        result: FloatArray = np.where(np.isfinite(values), values, np.nan)
        return result

    @staticmethod
    def _recent(
        short_term: SeasonalMaxReservation, groups: pd.Index, as_of: int, shown: list[ResourceRecommendation | None]
    ) -> list[list[float | None]]:
        """The observed usage line (max over pods per step) of the last day before as_of; None where no sample. Empty
        beside no recommendation (`shown`): nothing to compare it with, and 288 floats per container add up."""
        recent = short_term.recent(as_of, 86400)
        index = pd.Index(short_term.groups_).get_indexer(groups)
        return [_floats_or_none(recent[i]) if i >= 0 and rec is not None else [] for i, rec in zip(index, shown)]


def _with_vpa(
    rec: ResourceRecommendation | None,
    vpa: FloatArray,
    row: int,
    allowed: tuple[float | None, float | None],
    request_now: float,
    limit_now: float,
) -> ResourceRecommendation | None:
    """A recommendation with its target and bounds from the `vpa` policy where it sizes this group (row of
    `WorkloadRecommender._vpa_bounds`): clamped to the allowed range like VPA's resource policy, the uncapped target
    before that; the memory cap and limit floor of the forecast policy do not apply. None where VPA has nothing."""
    if rec is None or np.isnan(vpa[row, 0]):
        return rec
    if vpa[row, 0] < 0:
        return None
    target, lower, upper = (float(v) for v in vpa[row])
    low = -np.inf if allowed[0] is None else allowed[0]
    high = np.inf if allowed[1] is None else allowed[1]
    capped = float(np.clip(target, low, high))
    limit, rule = recommended_limit(capped, request_now, limit_now, np.nan)
    models = (
        rec.models.model_copy(
            update={
                "target": "VPA recommender v1.5.1",
                "quality": {line: q for line, q in rec.models.quality.items() if line != "target"},
            }
        )
        if rec.models
        else None
    )
    return rec.model_copy(
        update={
            "target": capped,
            "lower_bound": float(np.clip(lower, low, high)),
            "upper_bound": float(np.clip(upper, low, high)),
            "uncapped_target": target,
            "policy": "vpa",
            "models": models,
            "limit_floor": None,
            "limit": limit,
            "limit_rule": rule,
        }
    )


def _floats_or_none(values: FloatArray) -> list[float | None]:
    """A row as JSON-ready floats, None for NaN (`tolist` converts in C: 288 floats x 10,000 containers add up)."""
    return [None if v != v else v for v in values.tolist()]


def _significant(value: float, digits: int = 6) -> float:
    return float(f"{value:.{digits - 1}e}")


def _oom_counts(oom_frame: pd.DataFrame | None) -> pd.Series:
    """OOM kills per group label (only groups with at least one)."""
    if oom_frame is None:
        return pd.Series([], dtype=np.int64)
    return oom_frame["group"].astype(str).value_counts().astype(np.int64)


#: The request line's forecaster is the `request` attribute of ResourceForecast; the JSON calls that line target.
_FORECAST_LINE = {"target": "request", "short_term": "short_term", "long_term": "long_term"}


def recommended_limit(
    target: float, request_now: float, limit_now: float, floor: float
) -> tuple[float | None, str | None]:
    """The limit we would set beside `target` and the rule that set it: scaled with the request as VPA does
    (limit x target / request), never below the target, and for memory never below `floor` (the observed peak plus a
    margin; NaN for CPU). None without a current limit (nothing to scale, and we never add one)."""
    if not np.isfinite(limit_now):
        return None, None
    scaled = limit_now * target / request_now if np.isfinite(request_now) and request_now > 0 else limit_now
    candidates = {"scaled with the request": scaled, "the request": target}
    if np.isfinite(floor):
        candidates["observed 7-day peak + margin"] = floor
    rule = max(candidates, key=lambda name: candidates[name])
    return float(candidates[rule]), rule


def _sizer(
    confidence: FloatArray,
    per_pod: FloatArray,
    pod_minimum: float,
    min_allowed: float | None,
    max_allowed: float | None,
    policy: PolicySettings,
) -> Callable[[FloatArray, FloatArray, FloatArray, FloatArray], RequestBounds]:
    """VPA's bounds from histogram percentiles, with the target replaced by our request forecast where there is one."""

    def size(lower: FloatArray, target: FloatArray, upper: FloatArray, forecast: FloatArray) -> RequestBounds:
        vpa = request_bounds(lower, target, upper, confidence, per_pod, pod_minimum, min_allowed, max_allowed, policy)
        return with_target(vpa, forecast, pod_minimum / np.maximum(per_pod, 1.0), min_allowed, max_allowed)

    return size
