"""The learned short-term line of the live cadence: one global model for the fleet, calibrated online.

At an issue time t the line covers the next `horizon_seconds` (the live loop re-issues it every interval, `replay`
every `--every`), built from the samples before t only: the last values, the maxima, means and quantiles over 15
minutes to a day, the same block a day and a week before, the week's max, the time of day and the weekday, each a
ratio to the container's recent scale (`container_scale`), so one model serves the fleet and a container it never
saw. The line is a product of powers of those statistics (a geometric blend) whose exponents are fitted on the
fleet's rolling origins for what the fleet is judged on: the room left after one factor puts P of the samples above
the line (`matched_cost`). Per-row quantile regression minimises another loss, and on the development half its
lines needed more room at the same risk than the max of the last hours; the blend starts from the best single
statistic and is never fitted dearer than it. Its fitting days flatter how evenly it spreads the misses over the
containers; `validation_fraction` holds the newest of them out and draws the blend toward its best statistic as far
as keeps its p90 container violation there within half a point of the statistic's (off: it buys evenness with
room). Quantile trees may join the blend's inputs (`quantile_trees`).

Calibration is online (`AdaptiveScale`): adaptive conformal inference on a multiplicative factor, a log-factor for
the fleet and a slower one per container, moved after every interval by the observed violation share against P (the
fleet's relative to P), so the asked level holds while the fleet drifts, with no refit. A container's factor sinks faster than it rises (one hour
above its line raised it for many, and a container its line never reached gave its room back slowly), and the
containers' factors move against each other only: the fleet's factor holds the level. The share counts each pod's own samples (a line is learned
on the per-step maximum over a workload's pods, and a request is judged on every pod's usage).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from models.forecast import check_grid, nan_quantiles
from models.migration import migrate_live_line_state
from recommender.arrays import FloatArray, IntArray, quantile_of
from recommender.settings import LiveLineSettings
from recommender.units import SECONDS_PER_HOUR

STEPS_PER_DAY = 288
STEPS_PER_WEEK = 7 * STEPS_PER_DAY
#: Look-back windows of the recent features, 5-minute steps: 15 min, 1 h, 6 h, 24 h.
WINDOWS = (3, 12, 72, STEPS_PER_DAY)
FEATURE_NAMES = (
    "last",
    *(f"{stat}_{w}" for w in WINDOWS for stat in ("max", "mean")),
    "p50_72",
    "p90_72",
    "p50_288",
    "p90_288",
    "p99_288",
    "max_week",
    "day_ago_max",
    "day_ago_mean",
    "week_ago_max",
    "week_ago_mean",
    "missing_day",
    "hour_of_day",
    "day_of_week",
)


def _nan_reduce(function: Any, values: FloatArray) -> FloatArray:
    """`np.nanmax` / `np.nanmean` along the last axis, NaN (not a warning) where a row has no value."""
    if values.shape[-1] == 0:
        return np.full(values.shape[:-1], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result: FloatArray = function(values, axis=-1)
    return result


def _window(grid: FloatArray, stop: int, steps: int) -> FloatArray:
    """Columns [stop - steps, stop) of the grid, cut at its left edge."""
    return grid[:, max(stop - steps, 0) : max(stop, 0)]


def container_scale(grid: FloatArray, position: int) -> FloatArray:
    """Each row's scale at column `position` (history: the columns before it): the max of the last hour, floored by
    a tenth of the last week's max (an idle hour of a bursty container does not blow its ratios up); NaN where the
    week has no sample or only zeros. A recent scale makes "as high as the last hour" a ratio near 1 for every
    container, which the trees refine; a weekly mean left them to relearn that identity leaf by leaf (on dev, the
    recent scale cut CPU's matched overprovision at 1 % from 322 % to 263 %, before the other choices)."""
    hour = _nan_reduce(np.nanmax, _window(grid, position, 12))
    week = _nan_reduce(np.nanmax, _window(grid, position, STEPS_PER_WEEK))
    scale = np.fmax(hour, 0.1 * week)
    result: FloatArray = np.where(scale > 0, scale, np.nan)
    return result


def live_features(
    grid: FloatArray, position: int, horizon_steps: int, issued_at_seconds: int
) -> tuple[FloatArray, FloatArray]:
    """The (rows x features) matrix at column `position` of a usage grid (5-minute steps, rows: containers) and
    each row's scale. Only columns before `position` are read: a line issued there cannot see what it forecasts.
    Ratios to the scale; NaN where a window has no sample (the trees take NaN as its own branch)."""
    scale = container_scale(grid, position)
    columns: list[FloatArray] = [grid[:, position - 1] if position > 0 else np.full(grid.shape[0], np.nan)]
    for steps in WINDOWS:
        recent = _window(grid, position, steps)
        columns += [_nan_reduce(np.nanmax, recent), _nan_reduce(np.nanmean, recent)]
    columns += nan_quantiles(_window(grid, position, 72), (0.5, 0.9))
    columns += nan_quantiles(_window(grid, position, STEPS_PER_DAY), (0.5, 0.9, 0.99))
    columns.append(_nan_reduce(np.nanmax, _window(grid, position, STEPS_PER_WEEK)))
    for lag in (STEPS_PER_DAY, STEPS_PER_WEEK):
        block = _window(grid, min(position - lag + horizon_steps, position), horizon_steps)
        block = block if position - lag >= 0 else np.full((grid.shape[0], 0), np.nan)
        columns += [_nan_reduce(np.nanmax, block), _nan_reduce(np.nanmean, block)]
    ratios = np.column_stack(columns) / scale[:, None]
    day = _window(grid, position, STEPS_PER_DAY)
    missing = np.isnan(day).sum(axis=1) / STEPS_PER_DAY + (STEPS_PER_DAY - day.shape[1]) / STEPS_PER_DAY
    hour = (issued_at_seconds % 86400) / 3600.0
    weekday = float((issued_at_seconds // 86400 + 3) % 7)  # 1970-01-01 was a Thursday: Monday is 0
    n = grid.shape[0]
    features = np.column_stack([ratios, missing, np.full(n, hour), np.full(n, weekday)])
    return features, scale


def rows_features(
    grid: FloatArray, rows: IntArray, position: int, horizon_steps: int, issued_at_seconds: int
) -> tuple[FloatArray, FloatArray]:
    """`live_features(grid[rows], ...)`, from a copy of those rows' last week before `position` only (all that the
    features read): the training's 336 origins a resource copied each row's 14 days, 32 MB an origin at 1,000
    containers and a fifth of the training set's time."""
    first = max(position - STEPS_PER_WEEK, 0)
    return live_features(grid[rows, first:position], position - first, horizon_steps, issued_at_seconds)


def usable_rows(grid: FloatArray, position: int, min_history_steps: int) -> npt.NDArray[np.bool_]:
    """Rows the model may forecast at `position`: a known scale, at least `min_history_steps` samples in the last
    week and at least one in the last hour (cold starts and gaps take the fallback line)."""
    week = _window(grid, position, STEPS_PER_WEEK)
    hour = _window(grid, position, 12)
    known: npt.NDArray[np.bool_] = (
        (np.sum(~np.isnan(week), axis=1) >= min_history_steps)
        & (np.sum(~np.isnan(hour), axis=1) > 0)
        & np.isfinite(container_scale(grid, position))
    )
    return known


class UsableRows:
    """`usable_rows` of one grid at many positions (the training's rolling origins), from running counts of its
    known, positive and +inf cells: a position costs a subtraction per row instead of reading its week. A scale
    is known where the week holds a positive value and no +inf, which would be its max (`container_scale`)."""

    def __init__(self, grid: FloatArray, min_history_steps: int) -> None:
        self.min_history_steps = min_history_steps
        zero = np.zeros((grid.shape[0], 1), dtype=np.int32)
        with np.errstate(invalid="ignore"):
            cells = (~np.isnan(grid), np.isfinite(grid) & (grid > 0), np.isposinf(grid))
        self.known, self.positive, self.infinite = (
            np.hstack([zero, np.cumsum(c, axis=1, dtype=np.int32)]) for c in cells
        )

    def __call__(self, position: int) -> npt.NDArray[np.bool_]:
        def count(running: npt.NDArray[np.int32], steps: int) -> npt.NDArray[np.int32]:
            stop = max(position, 0)
            counted: npt.NDArray[np.int32] = running[:, stop] - running[:, max(position - steps, 0)]
            return counted

        usable: npt.NDArray[np.bool_] = (
            (count(self.known, STEPS_PER_WEEK) >= self.min_history_steps)
            & (count(self.known, 12) > 0)
            & (count(self.positive, STEPS_PER_WEEK) > 0)
            & (count(self.infinite, STEPS_PER_WEEK) == 0)
        )
        return usable


#: The recent-window statistics the line blends (each a ratio to the container's scale).
BLEND_STATISTICS = (
    "max_3",
    "max_12",
    "max_72",
    "max_288",
    "p99_288",
    "p90_288",
    "mean_12",
    "day_ago_max",
    "week_ago_max",
    "max_week",
)
_RATIO_FLOOR = 1e-3
#: The blend's weights against its best statistic tried on the rows it was not fitted on, largest first.
BLEND_WEIGHTS = (1.0, 0.75, 0.5, 0.25)


def blend_inputs(features: FloatArray, trees: FloatArray | None = None) -> FloatArray:
    """The logs of the blended statistics (and of the trees' forecast, when given), a missing one (no sample a day or
    a week back) taken as the day's max, every ratio floored at 1e-3 of the scale."""
    names = list(FEATURE_NAMES)
    chosen = features[:, [names.index(name) for name in BLEND_STATISTICS]]
    fill = features[:, names.index("max_288")]
    chosen = np.where(np.isnan(chosen), fill[:, None], chosen)
    columns = [chosen] if trees is None else [chosen, trees[:, None]]
    logs: FloatArray = np.log(np.maximum(np.nan_to_num(np.column_stack(columns), nan=1.0), _RATIO_FLOOR))
    return logs


def matched_cost(line: FloatArray, usage: FloatArray, weights: FloatArray, target_violation: float) -> float:
    """Overprovision of `line` after one factor makes `target_violation` of the samples exceed it: the fleet's room
    at the asked risk (`(1 - P)`-quantile of usage / line x sum(line) / sum(usage) - 1, sums in cores or bytes)."""
    factor = quantile_of(usage / line, 1.0 - target_violation)
    return _room(factor, line, weights, float(np.sum(usage * weights)))


def _room(factor: float, line: FloatArray, weights: FloatArray, usage_total: float) -> float:
    """The overprovision of `line` scaled by `factor` against `usage_total` (the usage's sum weighted by `weights`),
    sums in cores or bytes."""
    return factor * float(np.sum(line * weights)) / usage_total - 1.0


class MatchedScores:
    """`matched_cost` of a line and the p90 over containers of each one's share of samples above it once scaled to
    the matched level (the harness's fairness figure), from one quantile, for any line over the same rows: the
    blend's fit asks for both a thousand times a resource, so what does not depend on the line (the usage's
    weighted sum, each container's sample count) is computed once."""

    def __init__(
        self, usage: FloatArray, weights: FloatArray, owners: npt.NDArray[np.int64], target_violation: float
    ) -> None:
        self.usage, self.weights, self.owners = usage, weights, owners
        self.target_violation = target_violation
        self.usage_total = float(np.sum(usage * weights))
        counts = np.bincount(owners)
        self.seen = counts > 0
        self.counts = counts[self.seen]

    def __call__(self, line: FloatArray) -> tuple[float, float]:
        ratio = self.usage / line
        factor = quantile_of(ratio, 1.0 - self.target_violation)
        cost = _room(factor, line, self.weights, self.usage_total)
        above = np.bincount(self.owners[ratio > factor], minlength=self.seen.size)[self.seen]
        shares = above / self.counts
        return cost, float(np.quantile(shares, 0.9)) if shares.size else 0.0


def matched_scores(
    line: FloatArray, usage: FloatArray, weights: FloatArray, owners: npt.NDArray[np.int64], target_violation: float
) -> tuple[float, float]:
    """`MatchedScores` of one line."""
    return MatchedScores(usage, weights, owners, target_violation)(line)


class LiveLineForecaster(BaseEstimator):  # type: ignore[misc]
    """The global model of the live short-term line (module docstring): a blend of recent-window statistics whose
    exponents are learned on the fleet's rolling origins for the fleet's room at the asked risk, optionally with a
    quantile-tree forecast among its inputs.

    Parameters: `target_violation` P, `horizon_seconds` the block a line covers, `origin_stride_seconds` the spacing
    of the rolling training origins (None: the block, so the origins' blocks tile the training days), `training_days`
    how far back they go, `max_training_rows` a cap on the (origin, step) rows fitted (a random subset above it: a
    big fleet costs no more than this), `min_history_steps` the samples a container needs in its last week;
    `quantile_trees` adds scikit-learn's
    `HistGradientBoostingRegressor(loss="quantile")` at `trees_quantile` (its own parameters `max_iter`,
    `learning_rate`, `max_leaf_nodes`, `min_samples_leaf`) to the blend, fitted out of fold by time so the blend
    weighs honest forecasts; `fairness_tolerance` how much the blend's p90 container violation may exceed its best
    statistic's; `validation_fraction` the newest share of the training rows the blend is not fitted on but checked
    on (`_shrunk`); `fleet_adaptation_rate`, `own_adaptation_rate` and `own_sink_rate` the online calibration's
    (`AdaptiveScale`); `floor_at_last_step`: a line issued (`issue`) is never below the step just seen.
    Fitted: `coef_` (an exponent per input), `level_` (the factor that puts P of the training samples above the
    line), `trees_` (the two fold models, or empty), `training_rows_`, `training_cost_`, `baseline_costs_` (each
    statistic alone, on the same rows: what the blend had to beat), `fairness_limit_`, `shrinkage_` (the blend's
    weight against its best statistic that the newest rows allowed: 1 the blend as fitted, 0 the statistic).
    """

    def __init__(
        self,
        target_violation: float = 0.01,
        horizon_seconds: int = 3600,
        step_seconds: int = 300,
        origin_stride_seconds: int | None = None,
        training_days: int = 14,
        max_training_rows: int = 100_000,
        min_history_steps: int = 288,
        quantile_trees: bool = False,
        trees_quantile: float = 0.95,
        max_iter: int = 100,
        learning_rate: float = 0.1,
        max_leaf_nodes: int = 8,
        min_samples_leaf: int = 3000,
        fairness_tolerance: float = 0.005,
        validation_fraction: float = 0.0,
        fleet_adaptation_rate: float = 0.0025,
        own_adaptation_rate: float = 0.02,
        own_sink_rate: float = 0.08,
        floor_at_last_step: bool = False,
        random_state: int = 0,
    ) -> None:
        self.target_violation = target_violation
        self.horizon_seconds = horizon_seconds
        self.step_seconds = step_seconds
        self.origin_stride_seconds = origin_stride_seconds
        self.training_days = training_days
        self.max_training_rows = max_training_rows
        self.min_history_steps = min_history_steps
        self.quantile_trees = quantile_trees
        self.trees_quantile = trees_quantile
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.fairness_tolerance = fairness_tolerance
        self.validation_fraction = validation_fraction
        self.fleet_adaptation_rate = fleet_adaptation_rate
        self.own_adaptation_rate = own_adaptation_rate
        self.own_sink_rate = own_sink_rate
        self.floor_at_last_step = floor_at_last_step
        self.random_state = random_state

    @classmethod
    def from_settings(
        cls,
        settings: LiveLineSettings,
        target_violation: float,
        step_seconds: int = 300,
        horizon_seconds: int | None = None,
    ) -> Self:
        """The model of these settings (each field but `enabled` is the parameter of its name) at a risk level;
        `horizon_seconds`, where given, instead of the settings': a caller that holds each line for its own cadence
        (`replay --every`, the backtest's hourly issues) fits the model for that block."""
        fields = settings.model_dump(exclude={"enabled"})
        if horizon_seconds is not None:
            fields["horizon_seconds"] = horizon_seconds
        return cls(target_violation=target_violation, step_seconds=step_seconds, **fields)

    @property
    def horizon_steps(self) -> int:
        return max(int(self.horizon_seconds // self.step_seconds), 1)

    def training_set(
        self, grids: Sequence[FloatArray], grid_end: int, max_rows: int | None = None
    ) -> tuple[FloatArray, FloatArray, FloatArray, npt.NDArray[np.int64]]:
        """Features, targets (usage / scale) and weights (the scale) at the rolling origins of the grids' last
        `training_days` (grids of a fleet's partitions, all ending at `grid_end`), newest origin first and, within
        an origin, grid by grid: the rows of a fleet cut into partitions come in the order of one grid of it. Each
        origin's block lies whole inside the grid; only data before an origin forms its features. `max_rows`: past
        it, a random subset of that many (`random_state`), in the same order, drawn before each container's features
        are repeated for each step of its block, and features are computed only for the containers a kept row needs:
        the whole set of 1,000 containers x 14 days (4 million rows of 25 features) took 1.4 GB, the peak of a
        training run, and at 10,000 containers most of its time."""
        n = self.horizon_steps
        # By default the origins' blocks tile the training days: each step is a target once.
        stride_seconds = self.horizon_seconds if self.origin_stride_seconds is None else self.origin_stride_seconds
        stride = max(int(stride_seconds // self.step_seconds), 1)
        # Per origin and grid, the usable containers and their targets over the block; features come later, only for
        # the containers a kept row needs (each row's features read its own row alone, so a subset's are the same).
        # Found grid by grid (one grid's running counts alive at a time), kept by (origin, grid).
        # The usable rows are kept as bits and the targets read from the grid again when used: an origin every
        # step (the next step's line) kept 4,032 row lists and target blocks, another grid's worth of memory.
        found: dict[tuple[int, int], tuple[FloatArray, int, int, npt.NDArray[np.uint8], int]] = {}
        firsts = np.cumsum([0, *(grid.shape[0] for grid in grids)])
        offsets = range(n, self.training_days * STEPS_PER_DAY + 1, stride)
        for index, (grid, first_row) in enumerate(zip(grids, firsts.tolist())):
            usable_at = UsableRows(grid, self.min_history_steps)
            for offset in offsets:
                position = grid.shape[1] - offset
                if position < STEPS_PER_DAY:
                    continue
                usable = usable_at(position)
                known = int(np.count_nonzero(~np.isnan(grid[usable, position : position + n])))
                if known:
                    found[offset, index] = (grid, position, first_row, np.packbits(usable), known)
        blocks = [found[key] for key in sorted(found)]
        if not blocks:
            return np.empty((0, len(FEATURE_NAMES))), np.empty(0), np.empty(0), np.empty(0, dtype=np.int64)
        bounds = np.cumsum([0, *(block[4] for block in blocks)])
        keep = None
        if max_rows is not None and bounds[-1] > max_rows:
            keep = np.sort(np.random.default_rng(self.random_state).choice(bounds[-1], max_rows, replace=False))
        parts_x, parts_y, parts_w, parts_o = [], [], [], []
        for (grid, position, first_row, bits, _), start, stop in zip(blocks, bounds[:-1], bounds[1:]):
            rows = np.flatnonzero(np.unpackbits(bits, count=grid.shape[0]))
            usage = grid[rows, position : position + n]
            which, steps = np.nonzero(~np.isnan(usage))
            if keep is not None:
                chosen = keep[np.searchsorted(keep, start) : np.searchsorted(keep, stop)] - start
                which, steps = which[chosen], steps[chosen]
            if which.size == 0:
                continue
            needed, which = np.unique(which, return_inverse=True)  # the containers of the kept rows, in order
            issued = grid_end - (grid.shape[1] - position) * self.step_seconds
            features, scale = rows_features(grid, rows[needed], position, n, issued)
            parts_x.append(features[which])
            parts_y.append(usage[needed[which], steps] / scale[which])
            parts_w.append(scale[which])
            parts_o.append(first_row + rows[needed[which]])
        if not parts_x:  # nothing kept
            return np.empty((0, len(FEATURE_NAMES))), np.empty(0), np.empty(0), np.empty(0, dtype=np.int64)
        owners = np.concatenate(parts_o).astype(np.int64)
        return np.concatenate(parts_x), np.concatenate(parts_y), np.concatenate(parts_w), owners

    def _trees(self, features: FloatArray, targets: FloatArray) -> Any:
        # Imported where used: a process that only applies a fitted line (serve, live) need not load it.
        from sklearn.ensemble import HistGradientBoostingRegressor

        return HistGradientBoostingRegressor(
            loss="quantile",
            quantile=self.trees_quantile,
            max_iter=self.max_iter,
            learning_rate=self.learning_rate,
            max_leaf_nodes=self.max_leaf_nodes,
            min_samples_leaf=self.min_samples_leaf,
            early_stopping=False,
            random_state=self.random_state,
        ).fit(features, targets)

    def fit(self, X: Any, y: Any = None, grid_end: int = 0) -> Self:
        """Learn from a (containers x steps) usage grid whose last column ends at `grid_end` (Unix seconds)."""
        return self.fit_grids([check_grid(X, type(self).__name__)], grid_end)

    def fit_grids(self, grids: Sequence[FloatArray], grid_end: int) -> Self:
        """`fit` on the grids of a fleet's partitions as on one grid of the whole fleet."""
        features, targets, weights, owners = self.training_set(grids, int(grid_end), self.max_training_rows)
        minimum = max(10 * self.min_samples_leaf if self.quantile_trees else 0, 100 * self.horizon_steps)
        if targets.size < minimum:
            raise ValueError(
                f"{type(self).__name__}: {targets.size} training rows, fewer than {minimum}: "
                "too little history for a learned line"
            )
        forecast = None
        self.trees_: list[Any] = []
        if self.quantile_trees:
            # Two folds by time (rows are newest first): each half's forecast comes from the other half's trees.
            half = targets.size // 2
            newer, older = slice(0, half), slice(half, targets.size)
            self.trees_ = [self._trees(features[older], targets[older]), self._trees(features[newer], targets[newer])]
            forecast = np.concatenate(
                [self.trees_[0].predict(features[newer]), self.trees_[1].predict(features[older])]
            )
        inputs = blend_inputs(features, forecast)
        self.baseline_costs_ = {
            name: matched_cost(np.exp(inputs[:, i]), targets, weights, self.target_violation)
            for i, name in enumerate(BLEND_STATISTICS)
        }
        start = np.zeros(inputs.shape[1])
        start[BLEND_STATISTICS.index(min(self.baseline_costs_, key=self.baseline_costs_.__getitem__))] = 1.0
        # The fleet's room must not be bought by giving up on some containers: the blend's p90 container violation
        # (at the matched level) stays within `fairness_tolerance` of the best statistic's.
        _, start_p90 = matched_scores(np.exp(inputs @ start), targets, weights, owners, self.target_violation)
        self.fairness_limit_ = start_p90 + self.fairness_tolerance
        # Rows are newest first: the blend is fitted on the older ones and checked on the newest, which it did not see.
        newest = int(round(targets.size * self.validation_fraction))
        blend = self._blend(start, inputs[newest:], targets[newest:], weights[newest:], owners[newest:])
        self.coef_, self.shrinkage_ = self._shrunk(start, blend, inputs, targets, weights, owners, newest)
        line = np.exp(inputs @ self.coef_)
        self.level_ = quantile_of(targets / line, 1.0 - self.target_violation)
        self.training_cost_ = matched_cost(line, targets, weights, self.target_violation)
        self.training_rows_ = int(targets.size)
        self.n_features_in_ = len(FEATURE_NAMES)
        return self

    def _blend(
        self, start: FloatArray, inputs: FloatArray, targets: FloatArray, weights: FloatArray, owners: IntArray
    ) -> FloatArray:
        """The exponents of the cheapest blend of `inputs` at the matched level whose p90 container violation stays
        within the tolerance of the `start` statistic's on the same rows (Powell's line searches from `start`: the
        cost is a quantile, flat between samples, where gradients say nothing)."""
        from scipy.optimize import minimize
        from threadpoolctl import threadpool_limits

        scores = MatchedScores(targets, weights, owners, self.target_violation)
        limit = scores(np.exp(inputs @ start))[1] + self.fairness_tolerance

        def cost(coef: FloatArray) -> float:
            matched, p90 = scores(np.exp(inputs @ coef))
            over = p90 - limit
            return matched + (0.0 if over <= 0 else 10.0 * (1.0 + over / self.target_violation))

        # A thousand (rows x 10) @ (10,) products a resource, 0.1-0.4 ms each on one thread: OpenBLAS's two threads,
        # synchronised for each, took 1-6 ms once other work kept the cores busy (a 1,000-container training's live
        # lines: 15-18 CPU s against 6.5-7). One thread does each row's same arithmetic, so the bits are the same.
        with threadpool_limits(limits=1, user_api="blas"):
            found = minimize(cost, start, method="Powell", options={"maxiter": 20, "xtol": 1e-3, "ftol": 1e-4})
        result: FloatArray = found.x if found.fun < cost(start) else start
        return result

    def _shrunk(
        self,
        start: FloatArray,
        blend: FloatArray,
        inputs: FloatArray,
        targets: FloatArray,
        weights: FloatArray,
        owners: IntArray,
        newest: int,
    ) -> tuple[FloatArray, float]:
        """The blend drawn toward its best statistic (a weighted geometric mean of the two lines) as little as keeps
        it fair on the `newest` rows it was not fitted on: the fit's days flatter its p90 container violation, and on
        the development half the pure blend's was 1-3 points above the statistic's on the next days. What is kept is
        also no dearer and no less fair than the statistic on all the rows; the statistic alone (weight 0) always is.
        """
        level, start_cost = self.target_violation, min(self.baseline_costs_.values())
        fresh = slice(0, newest)

        def fresh_p90(coef: FloatArray) -> float:
            return matched_scores(np.exp(inputs[fresh] @ coef), targets[fresh], weights[fresh], owners[fresh], level)[1]

        fresh_limit = fresh_p90(start) + self.fairness_tolerance if newest else np.inf
        for weight in BLEND_WEIGHTS:
            coef = weight * blend + (1.0 - weight) * start
            if newest and fresh_p90(coef) > fresh_limit:
                continue
            cost, p90 = matched_scores(np.exp(inputs @ coef), targets, weights, owners, level)
            if cost <= start_cost and p90 <= self.fairness_limit_:
                return coef, weight
        return start, 0.0

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(migrate_live_line_state(state))

    @property
    def description(self) -> str:
        """What draws the line, as the recommendations name it."""
        inputs = "recent usage and quantile trees" if self.quantile_trees else "recent usage"
        return f"learned blend of {inputs}, calibrated online (live, {self.horizon_seconds // 60} min)"

    def initial_scale(self) -> AdaptiveScale:
        """The online calibration's state before any interval was observed (factor 1)."""
        return AdaptiveScale(
            self.target_violation,
            self.fleet_adaptation_rate,
            self.own_adaptation_rate,
            max(SECONDS_PER_HOUR // self.step_seconds, 1),
            own_sink_rate=self.own_sink_rate,
        )

    def issue(self, X: Any, issued_at: int, factors: FloatArray) -> FloatArray:
        """The lines served from the grid's end: `predict` times the calibration's `factors`, with
        `floor_at_last_step` at least the grid's newest step where it has a sample. A blend fitted on a fleet
        whose usage follows its daily cycle can weigh the same time yesterday most; after a step up it then forecast
        the next step at the old level (0.29 cores for a container that had just moved from 0.25 to 1), where a level
        the container is at is not forecast to vanish within the step."""
        grid = check_grid(X, type(self).__name__)
        lines = self.predict(grid, issued_at=issued_at) * factors
        if not self.floor_at_last_step or grid.shape[1] == 0:
            return lines
        result: FloatArray = np.where(np.isnan(lines), np.nan, np.fmax(lines, grid[:, -1]))
        return result

    def predict(self, X: Any, issued_at: int = 0, position: int | None = None) -> FloatArray:
        """Per row of the grid, the line for the block starting at column `position` (default: the grid's end,
        issued at `issued_at`), in the grid's units; NaN where the container cannot be forecast (`usable_rows`)."""
        check_is_fitted(self, "coef_")
        grid = check_grid(X, type(self).__name__)
        position = grid.shape[1] if position is None else int(position)
        out = np.full(grid.shape[0], np.nan)
        rows = np.flatnonzero(usable_rows(grid, position, self.min_history_steps))
        if rows.size:
            features, scale = rows_features(grid, rows, position, self.horizon_steps, int(issued_at))
            forecast = np.mean([t.predict(features) for t in self.trees_], axis=0) if self.trees_ else None
            # Summed row by row (not a BLAS product, whose rounding follows the number of rows): a container's line
            # is the same bits whichever partition, or whole fleet, it is predicted in.
            logs = np.sum(blend_inputs(features, forecast) * self.coef_, axis=1)
            out[rows] = self.level_ * np.exp(logs) * scale
        return out


@dataclass(frozen=True)
class LiveIssue:
    """The lines in force: issued for the block starting at `at` (Unix seconds), one per grid row (NaN: none), with
    the calibration factors in them."""

    at: int
    lines: FloatArray
    factors: FloatArray


@dataclass(frozen=True)
class AdaptiveScale:
    """Online calibration of a line by adaptive conformal inference: the line is multiplied by
    exp(fleet + own[row]); an hour of samples moves the fleet's log-factor by `fleet_rate` x (observed violation
    share / P - 1), on the fleet's samples (an update that saw less, that share of it): a miss relative to the level,
    so the level is restored as fast at 1 % as at 5 % (an absolute move, rate x (share - P), took months to close a
    0.4-point gap at 1 %). Each container's
    log-factor moves on its own samples by `own_rate` x (share - P) when its share was above P, by `own_sink_rate` x
    (share - P) when below (None: `own_rate`, as states pickled before it were), less the interval's mean move of the
    containers' factors, so the fleet's factor alone holds the level. Rows are containers in a fixed order (a new
    version takes the factors over container by container: `models.workload.continue_calibration`)."""

    target_violation: float
    fleet_rate: float
    own_rate: float
    #: Steps of an hour: an update moves the factors by the share of an hour of samples it saw (the live loop's
    #: passes see one or two steps), so the rates are per hour of every served pod's samples, whatever the cadence
    #: and whatever block a line covers (a line for the next step, re-issued every step, adapts as fast an hour).
    steps_per_hour: int = 12
    fleet: float = 0.0
    own: FloatArray | None = None
    own_sink_rate: float | None = None
    #: The last update's pooled miss (sum of misses / P - samples) and its served samples (pods x horizon steps):
    #: what a fleet fitted in partitions adds up into one fleet factor (`models.workload.pool_calibration`).
    last_relative_sum: float = 0.0
    last_served: float = 0.0

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A state pickled before the fleet's move was relative to the level held an absolute `rate`: the same moves.
        if "rate" in state:
            state = {**state, "fleet_rate": state["rate"] * state["target_violation"]}
            del state["rate"]
        # One pickled before the rates were per hour moved per block its line covered: the same moves.
        if "horizon_steps" in state:
            state = {**state, "steps_per_hour": state["horizon_steps"]}
            del state["horizon_steps"]
        self.__dict__.update(state)

    def factors(self, n_rows: int) -> FloatArray:
        own = self.own if self.own is not None and self.own.size == n_rows else np.zeros(n_rows)
        result: FloatArray = np.exp(self.fleet + own)
        return result

    def updated(self, lines: FloatArray, observed: FloatArray, owners: IntArray | None = None) -> AdaptiveScale:
        """The state after an interval: `lines` (rows) the issued lines, `observed` (rows x steps) the usage since,
        NaN where unknown (rows without a line or a sample teach nothing). With `owners`, `observed` holds the pods'
        own usage (pods x steps), each pod's row of `lines` in `owners`: the level then holds for every pod's samples,
        as a request is judged (VPA's histograms count each pod's), not for each step's busiest pod, which a line
        learned on the per-step maximum over pods would otherwise be calibrated to."""
        owners = np.arange(lines.size) if owners is None else owners
        issued = lines[owners]
        above = observed > issued[:, None]
        known = ~np.isnan(observed) & ~np.isnan(issued)[:, None]
        known_steps = known.sum(axis=1)
        if known_steps.sum() == 0:
            return self
        counts = np.bincount(owners, weights=known_steps, minlength=lines.size)
        misses = np.bincount(owners, weights=(above & known).sum(axis=1), minlength=lines.size)
        # A row's pods seen in the interval: its misses count as a share of all of theirs.
        pods = np.bincount(owners, weights=known_steps > 0, minlength=lines.size)
        seen = counts > 0
        # An hour of every served pod moves the fleet by fleet_rate x (violation share / P - 1).
        served = float(pods.sum()) * self.steps_per_hour
        relative_sum = float(misses.sum() / self.target_violation - counts.sum())
        fleet = self.fleet + self.fleet_rate * relative_sum / served
        own = self.own.copy() if self.own is not None and self.own.size == lines.size else np.zeros(lines.size)
        excess = misses[seen] - self.target_violation * counts[seen]
        sink = self.own_rate if self.own_sink_rate is None else self.own_sink_rate
        moves = np.where(excess > 0, self.own_rate, sink) * excess / (pods[seen] * self.steps_per_hour)
        # The containers' factors move against each other only: a drift of them all (more sink than rise) would
        # leave the fleet's factor behind it, and the level with it (5.9 % at 5 % on the development half).
        own[seen] += moves - moves.mean()
        return replace(self, fleet=float(fleet), own=own, last_relative_sum=relative_sum, last_served=served)
