"""Per-container model selection and conformal calibration over the forecasters of `models.forecast`.

A rolling-origin backtest on each container's own history (the last `selection_days` days, each forecast from data
before that day only) scores every candidate with an Autopilot-style cost: a pinball loss at the target quantile
(usage above the line costs (1 - target) per unit, unused room below it `target` per unit) plus `change_weight` x
the line's changes, all relative to the container's usage. The cheapest candidate wins per container. Its margin
is then calibrated on the same out-of-sample days (conformal style): the line is scaled by the (1 - target)
quantile of usage / line, shrunk toward the fleet's factor when the container has few samples. The three steps are
pure functions so the backtest can run them on lines it has already computed; `SelectedForecaster` wires them.
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from models.boosting import GlobalQuantileBoostingForecaster
from models.forecast import (
    STEPS_PER_DAY,
    DecayedQuantileForecaster,
    FlatQuantileForecaster,
    FloatArray,
    StlForecaster,
    WindowQuantileForecaster,
    check_grid,
    nan_quantile,
)
from models.metrics import usage_to_line_ratio
from recommender.settings import ForecastSettings

IntArray = npt.NDArray[np.int64]


def selection_costs(past_lines: FloatArray, past_usage: FloatArray, target_violation: float, change_weight: float) -> FloatArray:
    """(models x containers) cost of each candidate's past lines (models x origins x containers x steps)."""
    usage = np.broadcast_to(past_usage, past_lines.shape)
    known = ~np.isnan(usage)
    over = np.where(known, np.maximum(usage - past_lines, 0.0), 0.0)
    under = np.where(known, np.maximum(past_lines - usage, 0.0), 0.0)
    pinball = ((1.0 - target_violation) * over + target_violation * under).sum(axis=(1, 3))
    changes = np.nansum(np.abs(np.diff(past_lines, axis=3)), axis=(1, 3))
    scale = np.maximum(np.nansum(past_usage, axis=(0, 2)), 1e-12)
    result: FloatArray = (pinball + change_weight * target_violation * changes) / scale
    return result


def choose_models(costs: FloatArray) -> IntArray:
    """Index of the cheapest candidate per container (the first candidate where no cost is known)."""
    filled = np.where(np.isnan(costs), np.inf, costs)
    result: IntArray = np.argmin(filled, axis=0).astype(np.int64)
    return result


#: Relative width of the log-spaced bins of the calibration sketch: the fleet factor is exact to this share.
SKETCH_RESOLUTION = 1e-4
_LOG_STEP = float(np.log1p(SKETCH_RESOLUTION))
_ZERO_BIN = np.iinfo(np.int64).min
_INF_BIN = np.iinfo(np.int64).max


def ratio_sketch(ratios: FloatArray) -> tuple[IntArray, IntArray]:
    """Sparse counts (bins, counts) of the known ratios over log bins of relative width `SKETCH_RESOLUTION`.

    Sketches of disjoint sets of containers add up exactly (`merge_sketches`), so a fleet's calibration quantile
    comes out the same whether the containers were fitted in one process or in partitions on many.
    """
    values = ratios[~np.isnan(ratios)]
    positive = np.isfinite(values) & (values > 0)
    bins = np.floor(np.log(np.where(positive, values, 1.0)) / _LOG_STEP).astype(np.int64)
    codes = np.where(positive, bins, np.where(np.isinf(values), _INF_BIN, _ZERO_BIN))
    unique, counts = np.unique(codes, return_counts=True)
    return unique.astype(np.int64), counts.astype(np.int64)


def merge_sketches(sketches: list[tuple[IntArray, IntArray]]) -> tuple[IntArray, IntArray]:
    """One sketch of the union of the sketched sets."""
    if not sketches:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    bins = np.concatenate([b for b, _ in sketches])
    unique, inverse = np.unique(bins, return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([c for _, c in sketches]), minlength=unique.size)
    return unique.astype(np.int64), counts.astype(np.int64)


def sketch_quantile(sketch: tuple[IntArray, IntArray], q: float) -> float:
    """The q-quantile by the "higher" rule of `nan_quantile`: the upper edge of the bin holding that sample (so
    never below it, and above it by at most `SKETCH_RESOLUTION`); NaN for an empty sketch."""
    bins, counts = sketch
    total = int(counts.sum())
    if total == 0:
        return float("nan")
    rank = min(max(int(np.ceil(q * total)), 1), total)
    code = int(bins[int(np.searchsorted(np.cumsum(counts), rank))])
    if code == _ZERO_BIN:
        return 0.0
    if code == _INF_BIN:
        return float("inf")
    return float(np.exp((code + 1) * _LOG_STEP))


def calibration_parts(past_lines: FloatArray, past_usage: FloatArray, target_violation: float) -> tuple[FloatArray, FloatArray, tuple[IntArray, IntArray]]:
    """Per container from its past lines (origins x containers x steps): own factor (the (1 - target) quantile of
    usage / line) and scored samples; and the sketch of all the ratios, from which the fleet factor comes."""
    unknown = np.isnan(past_usage) | np.isnan(past_lines)
    ratio = np.where(unknown, np.nan, usage_to_line_ratio(np.nan_to_num(past_usage), np.nan_to_num(past_lines)))
    per_container = np.moveaxis(ratio, 1, 0).reshape(ratio.shape[1], -1)
    samples = np.sum(~np.isnan(per_container), axis=1).astype(np.float64)
    return nan_quantile(per_container, 1.0 - target_violation), samples, ratio_sketch(per_container)


def blend_factors(own: FloatArray, samples: FloatArray, fleet: float, prior_samples: float, factor_range: tuple[float, float]) -> FloatArray:
    """Own and fleet factor blended by n / (n + prior_samples), n the container's scored samples; 1 with no samples
    anywhere in the fleet."""
    if np.isnan(fleet):
        return np.ones(own.shape[0])
    weight = samples / (samples + prior_samples)
    blended = np.where(samples > 0, weight * np.nan_to_num(own, posinf=factor_range[1]) + (1 - weight) * fleet, fleet)
    result: FloatArray = np.clip(np.nan_to_num(blended, nan=1.0, posinf=factor_range[1]), *factor_range)
    return result


def calibration_factors(
    past_lines: FloatArray,
    past_usage: FloatArray,
    target_violation: float,
    prior_samples: float,
    factor_range: tuple[float, float],
) -> FloatArray:
    """Per container: the factor making its past lines (origins x containers x steps) violate `target_violation`,
    its own blended with the fleet's (`blend_factors`)."""
    own, samples, sketch = calibration_parts(past_lines, past_usage, target_violation)
    return blend_factors(own, samples, sketch_quantile(sketch, 1.0 - target_violation), prior_samples, factor_range)


def history_summary(grid: FloatArray, recent_steps: int) -> FloatArray:
    """Per container (rows): max of the last `recent_steps`, max of all, and the count of known steps (NaN-free)."""
    with np.errstate(all="ignore"):
        masked = np.where(np.isnan(grid), -np.inf, grid)
        recent = masked[:, -recent_steps:].max(axis=1) if grid.shape[1] else np.full(grid.shape[0], -np.inf)
        observed = masked.max(axis=1) if grid.shape[1] else np.full(grid.shape[0], -np.inf)
    known = np.sum(~np.isnan(grid), axis=1).astype(np.float64)
    result: FloatArray = np.stack([np.where(np.isfinite(recent), recent, np.nan), np.where(np.isfinite(observed), observed, np.nan), known], axis=1)
    return result


def finish_line(line: FloatArray, summary: FloatArray, recent_steps: int, cold_start_factor: float, steps_per_day: int) -> FloatArray:
    """Reaction and cold start on a calibrated line (containers x steps), given `history_summary` of its usage.

    Fast up: the first `recent_steps` of the line never fall below the max of the last `recent_steps` of usage.
    Cold start: a container with under a day of samples gets `cold_start_factor` x its observed max (NaN if none):
    bounded by what it has shown, never an absurd value.
    """
    recent, observed, known = summary[:, 0], summary[:, 1], summary[:, 2]
    out = line.copy()
    head = min(recent_steps, out.shape[1])
    out[:, :head] = np.fmax(out[:, :head], recent[:, None])
    cold = known < steps_per_day
    out[cold] = (cold_start_factor * observed[cold])[:, None]
    return out


def model_name(estimator: BaseEstimator) -> str:
    """A one-line name of an estimator: its scikit-learn repr (non-default parameters only), without spaces."""
    return repr(estimator).replace("\n", "").replace(" ", "")


def constant_line(line: FloatArray) -> FloatArray:
    """Each row flat at its max (NaN rows stay NaN): the shape of the request and long-term lines."""
    with np.errstate(all="ignore"):
        peak = np.where(np.isnan(line), -np.inf, line).max(axis=1) if line.shape[1] else np.full(line.shape[0], np.nan)
    return np.repeat(np.where(np.isfinite(peak), peak, np.nan)[:, None], line.shape[1], axis=1)


class SelectedForecaster(BaseEstimator):  # type: ignore[misc]
    """Picks, per container, the candidate forecaster with the lowest rolling-origin cost; calibrates its margin.

    `constant=True` makes every line flat at its max over the horizon (the request and long-term lines).
    Fitted: `choice_` (candidate index per container), `costs_` (candidates x containers), `factors_`.
    """

    def __init__(
        self,
        candidates: list[BaseEstimator] | None = None,
        selection_days: int = 7,
        target_violation: float = 0.01,
        change_weight: float = 0.1,
        calibration_prior_samples: float = 1e6,
        factor_min: float = 0.8,
        factor_max: float = 1.25,
        recent_steps: int = 12,
        cold_start_factor: float = 1.5,
        constant: bool = False,
        steps_per_day: int = STEPS_PER_DAY,
    ) -> None:
        self.candidates = candidates
        self.selection_days = selection_days
        self.target_violation = target_violation
        self.change_weight = change_weight
        self.calibration_prior_samples = calibration_prior_samples
        self.factor_min = factor_min
        self.factor_max = factor_max
        self.recent_steps = recent_steps
        self.cold_start_factor = cold_start_factor
        self.constant = constant
        self.steps_per_day = steps_per_day

    def _candidates(self) -> list[BaseEstimator]:
        return list(self.candidates) if self.candidates else [FlatQuantileForecaster(steps_per_day=self.steps_per_day)]

    def fit(self, X: Any, y: Any = None) -> Self:
        grid = check_grid(X, type(self).__name__)
        per_day, n = self.steps_per_day, grid.shape[1]
        candidates = self._candidates()
        origins = [n - day * per_day for day in range(self.selection_days, 0, -1) if n - day * per_day >= per_day]
        past = np.full((len(candidates), len(origins), grid.shape[0], per_day), np.nan)
        actual = np.full((len(origins), grid.shape[0], per_day), np.nan)
        for o, origin in enumerate(origins):
            actual[o] = grid[:, origin : origin + per_day]
            for m, candidate in enumerate(candidates):
                past[m, o] = self._shape(clone(candidate).fit(grid[:, :origin]).predict(per_day))
        self.decide(past, actual)
        self.fitted_ = [clone(candidate).fit(grid) for candidate in candidates]
        self.summary_ = history_summary(grid, self.recent_steps)
        return self

    def decide(self, past_lines: FloatArray, past_usage: FloatArray) -> Self:
        """Choose and calibrate from candidates' past lines (models x origins x containers x steps) and usage.

        Keeps the calibration's parts (`own_factors_`, `calibration_samples_`, `ratio_sketch_`) so that a partition of
        a fleet can be recalibrated with the whole fleet's factor (`calibrate_with_fleet`)."""
        n_groups = past_lines.shape[2]
        if past_lines.shape[1] == 0:
            self.costs_ = np.zeros((past_lines.shape[0], n_groups))
            self.choice_ = np.zeros(n_groups, dtype=np.int64)
            self.own_factors_ = np.full(n_groups, np.nan)
            self.calibration_samples_ = np.zeros(n_groups)
            self.ratio_sketch_ = merge_sketches([])
        else:
            self.costs_ = selection_costs(past_lines, past_usage, self.target_violation, self.change_weight)
            self.choice_ = choose_models(self.costs_)
            chosen = past_lines[self.choice_, :, np.arange(n_groups), :].transpose(1, 0, 2)
            self.own_factors_, self.calibration_samples_, self.ratio_sketch_ = calibration_parts(
                chosen, past_usage, self.target_violation
            )
        return self.calibrate_with_fleet(self.ratio_sketch_)

    def calibrate_with_fleet(self, fleet_sketch: tuple[IntArray, IntArray]) -> Self:
        """Set `factors_` from the own factors and the fleet factor read from `fleet_sketch` (this fit's own sketch,
        or the merged sketches of every partition of the fleet)."""
        check_is_fitted(self, "ratio_sketch_")
        self.fleet_factor_ = sketch_quantile(fleet_sketch, 1.0 - self.target_violation)
        self.factors_ = blend_factors(
            self.own_factors_, self.calibration_samples_, self.fleet_factor_, self.calibration_prior_samples,
            (self.factor_min, self.factor_max),
        )
        return self

    def _shape(self, line: FloatArray) -> FloatArray:
        return constant_line(line) if self.constant else line

    def combine(self, lines: FloatArray, summary: FloatArray) -> FloatArray:
        """The final line from the candidates' current lines (models x containers x steps) and `history_summary`."""
        check_is_fitted(self, "choice_")
        picked = lines[self.choice_, np.arange(lines.shape[1]), :] * self.factors_[:, None]
        finished = finish_line(picked, summary, self.recent_steps, self.cold_start_factor, self.steps_per_day)
        return self._shape(finished)

    def predict(self, n_steps: int) -> FloatArray:
        check_is_fitted(self, "fitted_")
        lines = np.stack([self._shape(model.predict(n_steps)) for model in self.fitted_])
        return self.combine(lines, self.summary_)

    def model_names(self) -> list[str]:
        """A short name of each candidate, e.g. `WindowQuantileForecaster(window_steps=36)`."""
        return [model_name(candidate) for candidate in self._candidates()]


def short_term_candidates(settings: ForecastSettings) -> list[BaseEstimator]:
    """The short-term ensemble: seasonal windows, statsmodels STL, the global boosted model, and the flat rules as fallbacks and members."""
    days = settings.seasonal_days
    floor = settings.seasonal_floor_fraction
    seasonal = [
        WindowQuantileForecaster(days=days, window_steps=settings.narrow_window_steps, floor_fraction=floor),
        WindowQuantileForecaster(days=days, window_steps=settings.wide_window_steps, floor_fraction=floor),
        WindowQuantileForecaster(days=days, window_steps=settings.narrow_window_steps, floor_fraction=0.0),
        WindowQuantileForecaster(days=3, window_steps=settings.wide_window_steps, floor_fraction=floor),
    ]
    stl: list[BaseEstimator] = [StlForecaster(days=days)] if settings.use_stl else []
    return [*seasonal, *stl, *boosting_candidates(settings), *constant_candidates(settings)]


def boosting_candidates(settings: ForecastSettings) -> list[BaseEstimator]:
    """The global boosted quantile model when `use_boosting` is on (its jitter window is the narrow seasonal one)."""
    if not settings.use_boosting:
        return []
    return [
        GlobalQuantileBoostingForecaster(
            quantile=settings.boosting_quantile,
            days=settings.seasonal_days,
            train_days=settings.boosting_train_days,
            lag_window_steps=settings.narrow_window_steps,
            max_rows=settings.boosting_max_rows,
            max_iter=settings.boosting_max_iter,
        )
    ]


def constant_candidates(settings: ForecastSettings) -> list[BaseEstimator]:
    """Flat rules: p99 and max of the last 1, 3 and `seasonal_days` days, and decayed quantiles (Koordinator-like)."""
    flat: list[BaseEstimator] = [
        FlatQuantileForecaster(days=d, quantile=q) for d in (1.0, 3.0, float(settings.seasonal_days)) for q in (0.99, 1.0)
    ]
    decayed = [
        DecayedQuantileForecaster(days=settings.seasonal_days, quantile=0.98, half_life_steps=STEPS_PER_DAY),
        DecayedQuantileForecaster(days=settings.seasonal_days, quantile=0.99, half_life_steps=STEPS_PER_DAY // 2),
        DecayedQuantileForecaster(days=3, quantile=0.99, half_life_steps=STEPS_PER_DAY),
    ]
    return [*flat, *decayed]


def selected_forecaster(settings: ForecastSettings, candidates: list[BaseEstimator], target: float, constant: bool) -> SelectedForecaster:
    """A `SelectedForecaster` over `candidates` with the settings' selection and calibration parameters."""
    return SelectedForecaster(
        candidates=candidates,
        selection_days=settings.selection_days,
        target_violation=target,
        change_weight=settings.change_weight,
        calibration_prior_samples=settings.calibration_prior_samples,
        factor_min=settings.calibration_factor_min,
        factor_max=settings.calibration_factor_max,
        recent_steps=settings.recent_window_steps,
        cold_start_factor=settings.cold_start_factor,
        constant=constant,
    )
