"""`recommender backtest`: the protocol of anchors.md section 6 for our lines and the built-in baselines.

Decisions every day at 00:00 UTC for each container with at least 7 days of history; at a decision time T a method
sees only samples before T. Lines: request (constant 24 h), short-term (288 five-minute values), long-term
(constant 7 days), peak (max over 24 h). Every pod's later samples are scored against its workload's line.
Our candidates' lines are computed once per day and per resource; selection and calibration at T use only the
lines of earlier origins whose day has passed, exactly what `recommend` recomputes (the fleet chooses at the level
of each line, `models.ensemble`).
The decision days are split in time: the first half is the validation part (where the model settings were
chosen), the second half the held-out part; both are reported beside the whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
from sklearn.base import clone

from models.ensemble import (
    LINE_DAYS,
    PeakForecaster,
    SelectedForecaster,
    constant_line,
    history_summary,
    line_forecaster,
    usage_after,
)
from models.forecast import column_grid, nan_quantile, usage_grid
from models.live_line import LiveLineForecaster
from models.metrics import LineScore, PeakScore, line_churn, score_line, score_peak
from models.pods import group_label, pod_pairs, with_group_labels
from pipelines.ingest import SampleBounds, read_usage
from pipelines.replay import STEP_SECONDS, ReplayPlan, served_lines
from pipelines.settings import TrainingSettings
from pipelines.train import map_big_blocks, new_workload_model
from recommender.arrays import FloatArray
from recommender.ceiling import LIMIT_COLUMNS, THROTTLED_COLUMNS, ceilings_at, within_ceiling
from recommender.progress import Step, quiet
from recommender.settings import ForecastSettings

DAY = 86400
RESOURCES = {"cpu": "cpu_cores", "memory": "memory_bytes"}
#: The stages `run_backtest` reports (its `step` calls without `detail`): reading, the baselines, the three lines'
#: candidates per resource, and the scores of all days and of each half.
STAGES = 2 + 4 * len(RESOURCES) + 3
LINES = ("request", "short_term", "long_term")
#: The lines whose day-to-day movement is reported (`line_churn`): the constant ones, which a request or a
#: reservation takes as it is.
CHURN_LINES = ("request", "long_term")
METHODS = ("ours", "vpa", "krr_simple", "koordinator_mid", "seasonal_naive", "foundation_short_term", "oracle")
#: The lines scored at the live cadence (`live_lines`): ours re-issued every hour, our day-ahead short-term line
#: as issued at each decision, and the simple rolling lines of `../shared/eval/rolling.py`.
LIVE_METHODS = ("ours_live", "ours_day_ahead", "max_1h", "max_6h")
LIVE_EVERY_SECONDS = 3600
LIVE_RETRAIN_SECONDS = 7 * DAY
ROLLING_STEPS = {"max_1h": 12, "max_6h": 72}


@dataclass
class Fleet:
    """Usage of one file on a day-aligned 5-minute grid: per group (pods pooled by max) and per pod."""

    origin: int
    step_seconds: int
    groups: pd.Index
    group_grid: dict[str, FloatArray]
    pod_grid: dict[str, FloatArray]
    pod_group: npt.NDArray[np.int64]
    first_sample: FloatArray
    frame: pd.DataFrame
    #: Each row's pod, a code per (group, pod) in the order they first appear.
    pod_of_row: npt.NDArray[np.int64]

    @property
    def steps_per_day(self) -> int:
        return DAY // self.step_seconds

    @property
    def days(self) -> int:
        return int(next(iter(self.group_grid.values())).shape[1]) // self.steps_per_day


def load_fleet(path: Path, step_seconds: int, bounds: SampleBounds) -> Fleet:
    """Read a tidy usage file into day-aligned group and pod grids (a pod's samples in one step: their max)."""
    map_big_blocks()  # the backtests' big arrays come and go a decision at a time: freed ones leave the process
    usage = read_usage(path, bounds)
    # Names as categories, not a string a row: the baselines' fit cuts the history at every decision (a copy of
    # codes, not of strings), and the estimators read categories as they do from Prometheus.
    names = [name for name in ("namespace", "workload", "pod", "container") if name in usage.columns]
    usage = with_group_labels(usage.astype(dict.fromkeys(names, "category")))
    pa.default_memory_pool().release_unused()  # the strings' Arrow buffers, freed by that, back to the system
    times = usage["timestamp"].to_numpy(dtype=np.float64)
    origin = int(times.min() // DAY * DAY)
    end = int(-(-(times.max() + 1) // DAY) * DAY)
    n_steps = (end - origin) // step_seconds
    groups = np.asarray(usage["group"].cat.codes, dtype=np.int64)
    labels = pd.Index(usage["group"].cat.categories)
    # A (group, pod) pair as one integer, factorized: no string a row (a pod's name may recur in other groups).
    pod_names = pd.factorize(usage["pod"])[0].astype(np.int64)
    pods, pod_group = pod_pairs(groups, pod_names)
    group_grid, pod_grid = {}, {}
    for resource, column in RESOURCES.items():
        values = usage[column].to_numpy(dtype=np.float64)
        group_grid[resource] = usage_grid(groups, times, values, len(labels), end, n_steps, step_seconds)
        pod_grid[resource] = usage_grid(pods, times, values, len(pod_group), end, n_steps, step_seconds)
    first = np.full(len(labels), np.inf)
    np.minimum.at(first, groups, times)
    return Fleet(origin, step_seconds, labels, group_grid, pod_grid, pod_group, first, usage, pods)


@dataclass
class Decisions:
    """Every method's lines at every decision day for one resource, (days x groups x steps) or (days x groups)."""

    short_term: dict[str, FloatArray] = field(default_factory=dict)
    request: dict[str, FloatArray] = field(default_factory=dict)
    long_term: dict[str, FloatArray] = field(default_factory=dict)
    peak: dict[str, FloatArray] = field(default_factory=dict)
    choices: dict[str, FloatArray] = field(default_factory=dict)
    #: (days x groups x steps) lines at the live cadence (`LIVE_METHODS`); empty where the grid is not 5-minute.
    live: dict[str, FloatArray] = field(default_factory=dict)


def daily_candidate_lines(grid: FloatArray, candidates: list[object], steps_per_day: int, constant: bool) -> FloatArray:
    """(models x days x groups x steps) day-ahead lines of each candidate from each day's origin (NaN on day 0); one
    step wide when `constant` (a constant line is one value a day)."""
    n_groups, n = grid.shape
    days = n // steps_per_day
    out = np.full((len(candidates), days, n_groups, 1 if constant else steps_per_day), np.nan)
    for m, candidate in enumerate(candidates):
        for day in range(1, days):
            fitted = clone(candidate).fit(grid[:, : day * steps_per_day])
            line = fitted.predict(steps_per_day)
            out[m, day] = constant_line(line)[:, :1] if constant else line
    return out


def selected_lines(
    grid: FloatArray, lines: FloatArray, selector: SelectedForecaster, decision_days: list[int], steps_per_day: int
) -> tuple[FloatArray, FloatArray]:
    """Our final line and chosen candidate at each decision day from the cached candidate lines: the origins of
    the `selection_days` before it, each scored on the usage after it up to the decision (a week at most for the
    long-term line, as `recommend` does)."""
    finals, choices = [], []
    horizon = (selector.horizon_days if selector.constant else 1) * steps_per_day
    for day in decision_days:
        first = max(day - selector.selection_days, 1)
        actual = usage_after(grid[:, : day * steps_per_day], [d * steps_per_day for d in range(first, day)], horizon)
        past = lines[:, first:day]
        model = clone(selector).decide(past, actual)
        summary = history_summary(grid[:, : day * steps_per_day], selector.recent_steps)
        finals.append(model.combine(lines[:, day], summary))
        choices.append(model.choice_.astype(np.float64))
    return np.stack(finals), np.stack(choices)


def _baselines(
    fleet: Fleet, settings: TrainingSettings, decision_days: list[int], step: Step
) -> dict[str, dict[str, FloatArray]]:
    """VPA target (the `vpa` request policy: VPA's recommender exactly), Koordinator mid and the foundation's
    short-term line at each decision, from the real estimators, and the factors that hold each of our lines for
    every pod (`pods/LINE`)."""
    per_day = fleet.steps_per_day
    out: dict[str, dict[str, list[FloatArray]]] = {
        r: {"vpa": [], "koordinator_mid": [], "foundation_short_term": [], **{f"pods/{line}": [] for line in LINES}}
        for r in RESOURCES
    }
    frame = fleet.frame
    # The foundation's rules only, with every workload on the `vpa` policy.
    baseline = new_workload_model(settings).set_params(
        forecast_enabled=False, request_policy="vpa", request_policy_rules=[]
    )
    step(f"baselines at {len(decision_days)} decisions")
    for i, day in enumerate(decision_days):
        as_of = fleet.origin + day * DAY
        step(f"decision {i + 1}/{len(decision_days)}", detail=True)
        history = frame[frame["timestamp"] < as_of]
        model = clone(baseline).fit(history)
        recs = model.predict(as_of=as_of, horizon_seconds=DAY)
        index = fleet.groups.get_indexer(
            pd.Index([group_label(r.namespace, r.workload, r.container) for r in recs.recommendations])
        )
        for resource in RESOURCES:
            vpa = np.full(len(fleet.groups), np.nan)
            mid = np.full(len(fleet.groups), np.nan)
            short = np.full((len(fleet.groups), per_day), np.nan)
            for row, rec in zip(index, recs.recommendations):
                res = getattr(rec, resource)
                if res is not None:
                    vpa[row], mid[row], short[row] = res.target, res.long_term, res.short_term
            out[resource]["vpa"].append(vpa)
            out[resource]["koordinator_mid"].append(mid)
            out[resource]["foundation_short_term"].append(short)
            for line in LINES:
                level = settings.forecast.target_for(line)
                out[resource][f"pods/{line}"].append(model.pod_ratios(resource, level, fleet.groups))
    return {r: {m: np.stack(v) for m, v in methods.items()} for r, methods in out.items()}


def _grid_baselines(grid: FloatArray, resource: str, decision_days: list[int], per_day: int) -> dict[str, FloatArray]:
    """KRR simple, seasonal naive (288 values) and the oracle (actual max of the next 24 h) at each decision."""
    krr, naive, oracle = [], [], []
    for day in decision_days:
        history = grid[:, max(day - 14, 0) * per_day : day * per_day]
        if resource == "cpu":
            krr.append(nan_quantile(history, 0.95))
        else:
            krr.append(nan_quantile(history, 1.0) * 1.15)
        past = grid[:, max(day - 7, 0) * per_day : day * per_day].reshape(grid.shape[0], -1, per_day)
        with np.errstate(all="ignore"):
            naive.append(np.nanmax(np.where(np.isnan(past), -np.inf, past), axis=1))
            future = grid[:, day * per_day : (day + 1) * per_day]
            oracle.append(np.nanmax(np.where(np.isnan(future), -np.inf, future), axis=1))
    return {
        "krr_simple": _finite(np.stack(krr)),
        "seasonal_naive": _finite(np.stack(naive)),
        "oracle": _finite(np.stack(oracle)),
    }


def _finite(values: FloatArray) -> FloatArray:
    result: FloatArray = np.where(np.isfinite(values), values, np.nan)
    return result


def live_lines(
    fleet: Fleet, resource: str, settings: TrainingSettings, decision_days: list[int], day_ahead: FloatArray, step: Step
) -> dict[str, FloatArray]:
    """The (days x groups x steps) lines of `LIVE_METHODS` over the decision days: ours as `recommender replay`
    issues it every hour (the learned line refitted weekly on earlier rows, calibrated online, the fallback where it
    cannot serve, held under the usage ceiling), our day-ahead short-term line (`day_ahead`), and the max of the last hour and of the last 6
    hours, re-issued every hour. Each hourly issue reads only columns before it."""
    grid, per_day = fleet.group_grid[resource], fleet.steps_per_day
    first, days = decision_days[0], len(decision_days)
    plan = ReplayPlan(
        fleet.origin + first * DAY,
        fleet.origin + (first + days) * DAY,
        LIVE_EVERY_SECONDS,
        LIVE_RETRAIN_SECONDS,
    )
    model = LiveLineForecaster.from_settings(
        settings.live_line, settings.forecast.short_term_target_violation, fleet.step_seconds, LIVE_EVERY_SECONDS
    )
    per_issue = LIVE_EVERY_SECONDS // fleet.step_seconds
    issued = {
        "ours_live": served_lines(
            grid,
            fleet.origin,
            plan,
            model,
            limit_grids(fleet, resource),
            settings.forecast,
            step,
            (fleet.pod_grid[resource], fleet.pod_group) if fleet.pod_group.size > grid.shape[0] else None,
        )
    }
    positions = [(t - fleet.origin) // fleet.step_seconds for t in plan.issue_times()]
    for method, steps in ROLLING_STEPS.items():
        with np.errstate(all="ignore"):
            issued[method] = _finite(
                np.stack(
                    [
                        np.nanmax(np.where(np.isnan(w), -np.inf, w), axis=1)
                        for w in (grid[:, max(p - steps, 0) : p] for p in positions)
                    ]
                )
            )
    # (issues x groups) -> (days x groups x steps): each issue's value over its hour's steps.
    out = {
        method: np.repeat(lines, per_issue, axis=0).reshape(days, per_day, -1).transpose(0, 2, 1)
        for method, lines in issued.items()
    }
    out["ours_day_ahead"] = day_ahead
    return {method: out[method] for method in LIVE_METHODS}


def decide(fleet: Fleet, settings: TrainingSettings, step: Step = quiet) -> tuple[list[int], dict[str, Decisions]]:
    """Every method's lines at every decision day (days with at least one container of >= 7 days of history)."""
    per_day = fleet.steps_per_day
    forecast = settings.forecast
    first_day = int(np.ceil((np.min(fleet.first_sample) - fleet.origin + 7 * DAY) / DAY))
    decision_days = list(range(max(first_day, 1), fleet.days))
    baselines = _baselines(fleet, settings, decision_days, step)
    results = {}
    for resource in RESOURCES:
        grid = fleet.group_grid[resource]
        decisions = Decisions()
        for line in LINE_DAYS:  # every line, from the one table of them (the report lists choices in this order)
            selector = line_forecaster(forecast, line)
            candidates, constant = selector.candidate_models(), selector.constant
            step(f"{resource}: {line} candidates ({len(candidates)} models x {fleet.days} days)")
            lines = daily_candidate_lines(grid, candidates, per_day, constant)
            ours, choices = selected_lines(grid, lines, selector, decision_days, per_day)
            # Held for every pod, as `recommend` holds it (`WorkloadRecommender.pod_ratios`).
            held = ours * baselines[resource][f"pods/{line}"][:, :, None]
            getattr(decisions, line)["ours"] = held if line == "short_term" else held[:, :, 0]
            decisions.choices[line] = choices
        grid_based = _grid_baselines(grid, resource, decision_days, per_day)
        from_model = baselines[resource]
        decisions.short_term.update(
            {
                "vpa": _flat(from_model["vpa"], per_day),
                "krr_simple": _flat(grid_based["krr_simple"], per_day),
                "koordinator_mid": _flat(from_model["koordinator_mid"], per_day),
                "seasonal_naive": grid_based["seasonal_naive"],
                "foundation_short_term": from_model["foundation_short_term"],
                "oracle": _flat(grid_based["oracle"], per_day),
            }
        )
        # A baseline's request and long-term lines are the max of its short-term line (itself, for the flat ones).
        with np.errstate(all="ignore"):
            decisions.peak = {
                method: _finite(np.nanmax(np.where(np.isnan(values), -np.inf, values), axis=2))
                for method, values in decisions.short_term.items()
            }
        for method, peak in decisions.peak.items():
            if method != "ours":
                decisions.request[method] = decisions.long_term[method] = peak
        # Our peak is its own point forecast (`PeakForecaster`), as `recommend` gives it, not the line's max.
        peak_model = PeakForecaster(selection_days=forecast.selection_days, quantile=forecast.peak_quantile)
        decisions.peak["ours"] = np.stack(
            [clone(peak_model).fit(grid[:, : day * per_day]).predict() for day in decision_days]
        )
        hold_under_ceiling(decisions, *ceilings(fleet, resource, decision_days, forecast))
        if fleet.step_seconds == STEP_SECONDS and LIVE_EVERY_SECONDS % fleet.step_seconds == 0:
            step(f"{resource}: the live line re-issued hourly over {len(decision_days)} days")
            decisions.live = live_lines(fleet, resource, settings, decision_days, decisions.short_term["ours"], step)
        else:
            step(f"{resource}: no live cadence on a {fleet.step_seconds} s grid (the live line is 5-minute)")
        results[resource] = decisions
    return decision_days, results


def limit_grids(fleet: Fleet, resource: str) -> tuple[FloatArray, FloatArray]:
    """The groups' newest limit and throttled share at each step (max over the pods sampled there): what the usage
    ceiling reads beside the usage."""
    frame, grid = fleet.frame, fleet.group_grid[resource]
    codes = np.asarray(frame["group"].cat.codes, dtype=np.int64)
    end = fleet.origin + grid.shape[1] * fleet.step_seconds
    limit, throttled = (
        column_grid(frame, column, codes, grid.shape, end, fleet.step_seconds)
        for column in (LIMIT_COLUMNS[resource], THROTTLED_COLUMNS[resource])
    )
    return limit, throttled


def ceilings(
    fleet: Fleet, resource: str, decision_days: list[int], forecast: ForecastSettings
) -> tuple[FloatArray, list[list[str | None]]]:
    """Per decision day and group, the usage ceiling `recommend` holds our lines under (`recommender.ceiling`): the
    newest limit before the decision (max over the pods sampled at that step) and the highest sample of the last
    `history_days`, with its evidence."""
    per_day, grid = fleet.steps_per_day, fleet.group_grid[resource]
    return ceilings_at(
        grid,
        *limit_grids(fleet, resource),
        [day * per_day for day in decision_days],
        forecast.history_days * per_day,
        forecast.ceiling_near_limit_fraction,
        forecast.ceiling_throttled_fraction,
    )


def hold_under_ceiling(decisions: Decisions, ceiling: FloatArray, evidence: list[list[str | None]]) -> None:
    """Our request, short-term, long-term and peak lines of each decision day held under that day's ceiling, as
    `recommend` holds them."""
    for table in (decisions.request, decisions.short_term, decisions.long_term, decisions.peak):
        table["ours"] = np.stack(
            [within_ceiling(values, ceiling[i], evidence[i]) for i, values in enumerate(table["ours"])]
        )


def _scored_samples(
    fleet: Fleet, pods: FloatArray, table: FloatArray, eligible: npt.NDArray[np.bool_], start: int, horizon_days: int
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """The pods' usage over the `horizon_days` from step `start`, a method's line for each of those samples (its
    group's: `table` is groups x steps, or one value a group for a constant line) and which samples are scored."""
    future = pods[:, start : start + horizon_days * fleet.steps_per_day]
    per_pod = table[fleet.pod_group] if table.ndim == 2 else table[fleet.pod_group][:, None]
    shaped = per_pod if table.ndim == 2 else np.broadcast_to(per_pod, future.shape)
    return future, shaped, ~np.isnan(future) & eligible[fleet.pod_group][:, None] & ~np.isnan(shaped)


def _flat(values: FloatArray, steps: int) -> FloatArray:
    return np.repeat(values[:, :, None], steps, axis=2)


@dataclass(frozen=True)
class MethodScores:
    lines: dict[str, LineScore]
    peak: PeakScore
    #: Per constant line (`CHURN_LINES`): `line_churn`, the share of day-over-day changes beyond `CHURN_FACTOR`.
    churn: dict[str, float]


def _eligible(fleet: Fleet, decision_days: list[int]) -> npt.NDArray[np.bool_]:
    """(days x groups): the groups with 7 days of history at each decision, the ones scored."""
    eligible: npt.NDArray[np.bool_] = (
        fleet.first_sample <= fleet.origin + np.asarray(decision_days)[:, None] * DAY - 7 * DAY
    )
    return eligible


def _pooled_score(
    fleet: Fleet,
    resource: str,
    decision_days: list[int],
    tables: FloatArray,
    chosen: list[int],
    horizon_days: int,
) -> LineScore:
    """One line's scores over every pod's samples after each chosen decision (`tables[i]`: the line issued at
    decision i, groups x steps or one value a group)."""
    pods, eligible, per_day = fleet.pod_grid[resource], _eligible(fleet, decision_days), fleet.steps_per_day
    samples = [
        _scored_samples(fleet, pods, tables[i], eligible[i], decision_days[i] * per_day, horizon_days) for i in chosen
    ]
    # The samples of every decision written into arrays of their total size (tens of millions for the long-term
    # line), not joined from a list: one copy of them is held, not two.
    sizes = [int(np.count_nonzero(mask)) for *_, mask in samples]
    usage, values = np.empty(sum(sizes)), np.empty(sum(sizes))
    containers = np.empty(sum(sizes), dtype=np.int64)
    for (future, shaped, mask), start, size in zip(samples, np.cumsum([0, *sizes[:-1]]).tolist(), sizes):
        usage[start : start + size], values[start : start + size] = future[mask], shaped[mask]
        containers[start : start + size] = np.nonzero(mask)[0]
    return score_line(usage, values, containers)


def score(
    fleet: Fleet, resource: str, decision_days: list[int], decisions: Decisions, day_slice: slice
) -> dict[str, MethodScores]:
    """Scores of every method on the decision days in `day_slice`, against every pod's usage after each decision."""
    per_day = fleet.steps_per_day
    groups = fleet.group_grid[resource]
    eligible = _eligible(fleet, decision_days)
    chosen = list(range(len(decision_days)))[day_slice]
    out = {}
    for method in METHODS:
        per_line = {
            line: _pooled_score(
                fleet, resource, decision_days, getattr(decisions, line)[method], chosen, LINE_DAYS[line]
            )
            for line in LINES
        }
        forecast, actual = [], []
        for i in chosen:
            day = decision_days[i]
            with np.errstate(all="ignore"):
                future = groups[:, day * per_day : (day + 1) * per_day]
                real = np.nanmax(np.where(np.isnan(future), -np.inf, future), axis=1)
            keep = eligible[i] & np.isfinite(real) & ~np.isnan(decisions.peak[method][i])
            forecast.append(decisions.peak[method][i][keep])
            actual.append(real[keep])
        churn = {line: line_churn(getattr(decisions, line)[method][chosen], eligible[chosen]) for line in CHURN_LINES}
        out[method] = MethodScores(per_line, score_peak(np.concatenate(forecast), np.concatenate(actual)), churn)
    return out


def score_live(
    fleet: Fleet, resource: str, decision_days: list[int], decisions: Decisions, day_slice: slice
) -> dict[str, LineScore]:
    """Scores of the lines at the live cadence (`LIVE_METHODS`) on the decision days in `day_slice`, on the same
    samples as the day-ahead lines' (empty without a live cadence)."""
    chosen = list(range(len(decision_days)))[day_slice]
    return {
        method: _pooled_score(fleet, resource, decision_days, lines, chosen, 1)
        for method, lines in decisions.live.items()
    }


@dataclass(frozen=True)
class BacktestResult:
    decision_days: list[int]
    origin: int
    scores: dict[str, dict[str, dict[str, MethodScores]]]  # part -> resource -> method
    live: dict[str, dict[str, dict[str, LineScore]]]  # part -> resource -> live method
    decisions: dict[str, Decisions]
    seconds: float
    candidate_names: dict[str, list[str]]


def run_backtest(path: Path, settings: TrainingSettings, step: Step = quiet) -> tuple[Fleet, BacktestResult]:
    """The whole protocol on one usage file."""
    started = time.perf_counter()
    step(f"reading {path}")
    fleet = load_fleet(path, settings.reservation.step_seconds, SampleBounds.at(settings.ingest, time.time()))
    days, decisions = decide(fleet, settings, step)
    half = len(days) // 2
    parts = {"all": slice(None), "validation": slice(0, half), "held_out": slice(half, None)}
    scores, live = {}, {}
    for part, day_slice in parts.items():
        step(f"scoring ({part})")
        scores[part] = {r: score(fleet, r, days, decisions[r], day_slice) for r in RESOURCES}
        live[part] = {r: score_live(fleet, r, days, decisions[r], day_slice) for r in RESOURCES}
    names = {line: line_forecaster(settings.forecast, line).model_names() for line in LINES}
    seconds = time.perf_counter() - started
    return fleet, BacktestResult(days, fleet.origin, scores, live, decisions, seconds, names)
