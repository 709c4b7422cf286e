"""A global gradient-boosted quantile forecaster: one model for the whole fleet, so short histories borrow from it.

Every container is divided by its own scale (the `quantile` of its last `days` days before the origin), so one
scikit-learn `HistGradientBoostingRegressor` with quantile loss serves containers of every size and learns the shape
around their flat quantile. Training rows are (container, step) pairs of the last `train_days` days, each day
forecast from its own origin (the day's first step, using only data before it): time of day and day of week
(positional, counted from the grid's end like every forecaster of `models.forecast`), the usage one day and seven
days earlier (the one-day lag also as a max over +- `lag_window_steps`: spikes come a few minutes early or late), the
level and volatility of the last day, the level of the last hour, and the log of the container's scale. Rows are
weighted by the scale, so the loss counts cores and bytes as the pooled overprovision does (unweighted, small
quiet containers got lines at several times their p99 on bitbrains' validation days). A `cold_share` of containers
is added again with its history cut to under a day, so the model learns what a new container's partial features
mean. The rows are subsampled to at most `max_rows` with a fixed seed. The line is capped at `ceiling_factor` x the
container's max of the last `days` days: a tree leaf learnt on other containers must not give an absurd bound.
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.base import BaseEstimator
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from models.forecast import STEPS_PER_DAY, FloatArray, check_grid, nan_quantile, repeat_daily

N_FEATURES = 9


def _nan_mean_std(block: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Row-wise mean and standard deviation ignoring NaN (NaN for rows without samples), without warnings."""
    known = ~np.isnan(block)
    count = known.sum(axis=1)
    filled = np.where(known, block, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, filled.sum(axis=1) / count, np.nan)
        spread = np.where(known, block - mean[:, None], 0.0)
        std = np.where(count > 0, np.sqrt((spread**2).sum(axis=1) / count), np.nan)
    return mean, std


def _day(grid: FloatArray, start: int, length: int) -> FloatArray:
    """Columns [start, start + length) of the grid, NaN where they fall outside it."""
    out = np.full((grid.shape[0], length), np.nan)
    lo, hi = max(start, 0), min(start + length, grid.shape[1])
    if hi > lo:
        out[:, lo - start : hi - start] = grid[:, lo:hi]
    return out


def _window_max(grid: FloatArray, start: int, length: int, half: int) -> FloatArray:
    """Per column of [start, start + length): the max over +- `half` columns ignoring NaN (NaN if none)."""
    segment = _day(grid, start - half, length + 2 * half)
    windows = sliding_window_view(np.where(np.isnan(segment), -np.inf, segment), 2 * half + 1, axis=1).max(axis=2)
    result: FloatArray = np.where(np.isfinite(windows), windows, np.nan)
    return result


class GlobalQuantileBoostingForecaster(BaseEstimator):  # type: ignore[misc]
    """One `HistGradientBoostingRegressor` (quantile loss at `quantile`) across all containers of the grid.

    `predict(n_steps)` forecasts the day after the grid's end and repeats it (the one-day lag is unknown beyond).
    Fit and predict run OpenMP on one thread: on a shared 2-core machine two threads contending with other work
    made a fit 20-40x slower (47 s instead of 1 s on a 250-container fortnight), and the callers are single-threaded.
    Fitted: `model_` (None when the grid holds no complete training day), `scale_` and `features_` (the last
    origin's per-container scale and (containers x steps x features) inputs), `ceiling_` (per-container cap).
    """

    def __init__(
        self,
        quantile: float = 0.99,
        days: int = 7,
        train_days: int = 7,
        lag_window_steps: int = 6,
        cold_share: float = 0.1,
        ceiling_factor: float = 1.5,
        max_rows: int = 50_000,
        max_iter: int = 100,
        learning_rate: float = 0.1,
        random_state: int = 0,
        steps_per_day: int = STEPS_PER_DAY,
    ) -> None:
        self.quantile = quantile
        self.days = days
        self.train_days = train_days
        self.lag_window_steps = lag_window_steps
        self.cold_share = cold_share
        self.ceiling_factor = ceiling_factor
        self.max_rows = max_rows
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.random_state = random_state
        self.steps_per_day = steps_per_day

    def _origin(self, grid: FloatArray, origin: int) -> tuple[FloatArray, FloatArray]:
        """Per-container scale at `origin` and the (containers x steps_per_day x features) rows of the next day."""
        per_day, n_groups = self.steps_per_day, grid.shape[0]
        past = _day(grid, origin - self.days * per_day, self.days * per_day)
        scale = nan_quantile(past, self.quantile)
        scale = np.where(scale > 0, scale, np.nan)
        last_day, hour = past[:, -per_day:], past[:, -max(per_day // 24, 1) :]
        level, volatility = _nan_mean_std(last_day)
        hour_level, _ = _nan_mean_std(hour)
        step = np.arange(per_day, dtype=np.float64)
        per_step = [
            _day(grid, origin - per_day, per_day),
            _day(grid, origin - 7 * per_day, per_day),
            _window_max(grid, origin - per_day, per_day, self.lag_window_steps),
        ]
        per_container = [level, volatility, hour_level]
        features = np.empty((n_groups, per_day, N_FEATURES))
        features[:, :, 0] = step[None, :]
        features[:, :, 1] = float((origin - grid.shape[1]) // per_day % 7)
        for i, values in enumerate(per_step):
            features[:, :, 2 + i] = values / scale[:, None]
        for i, values in enumerate(per_container):
            features[:, :, 5 + i] = (values / scale)[:, None]
        features[:, :, 8] = np.log10(scale)[:, None]
        return scale, features

    def fit(self, X: Any, y: Any = None) -> Self:
        grid = check_grid(X, type(self).__name__)
        per_day, n = self.steps_per_day, grid.shape[1]
        rng = np.random.default_rng(self.random_state)
        inputs, targets, weights = [], [], []
        for day in range(1, self.train_days + 1):
            origin = n - day * per_day
            if origin < per_day:
                break
            # A `cold_share` of containers again with their history cut to under a day: rows for new containers.
            cold = np.flatnonzero(rng.random(grid.shape[0]) < self.cold_share)
            truncated = grid[cold].copy()
            truncated[np.arange(n)[None, :] < (origin - rng.integers(1, per_day, cold.size))[:, None]] = np.nan
            for source in (grid, truncated):
                scale, features = self._origin(source, origin)
                inputs.append(features.reshape(-1, N_FEATURES))
                targets.append((source[:, origin : origin + per_day] / scale[:, None]).reshape(-1))
                weights.append(np.repeat(scale, per_day))
        rows = np.concatenate(inputs) if inputs else np.empty((0, N_FEATURES))
        target = np.concatenate(targets) if targets else np.empty(0)
        weight = np.concatenate(weights) if weights else np.empty(0)
        usable = np.flatnonzero(~np.isnan(target) & ~np.isnan(rows[:, 8]))
        if usable.size > self.max_rows:
            usable = np.sort(rng.choice(usable, self.max_rows, replace=False))
        self.model_: HistGradientBoostingRegressor | None = None
        if usable.size:
            regressor = HistGradientBoostingRegressor(
                loss="quantile",
                quantile=self.quantile,
                max_iter=self.max_iter,
                learning_rate=self.learning_rate,
                categorical_features=[1],
                random_state=self.random_state,
            )
            train = rows[usable]
            # A feature unknown in every row (the 7-day lag of a short grid) would break the binning: make it constant.
            train[:, np.isnan(train).all(axis=0)] = 0.0
            with threadpool_limits(limits=1, user_api="openmp"):
                self.model_ = regressor.fit(train, target[usable], sample_weight=weight[usable])
        self.scale_, self.features_ = self._origin(grid, n)
        self.ceiling_ = self.ceiling_factor * nan_quantile(grid[:, -self.days * per_day :], 1.0)
        return self

    def predict(self, n_steps: int) -> FloatArray:
        check_is_fitted(self, "features_")
        n_groups, per_day = self.features_.shape[:2]
        if self.model_ is None:
            return np.full((n_groups, n_steps), np.nan)
        with threadpool_limits(limits=1, user_api="openmp"):
            normalised = self.model_.predict(self.features_.reshape(-1, N_FEATURES)).reshape(n_groups, per_day)
        profile = np.clip(normalised * self.scale_[:, None], 0.0, self.ceiling_[:, None])
        return repeat_daily(profile, n_steps)
