"""The global boosted quantile forecaster: a daily sine, borrowing for a new container, seeds."""

from __future__ import annotations

import numpy as np

from models.boosting import GlobalQuantileBoostingForecaster
from models.ensemble import short_term_candidates
from recommender.settings import ForecastSettings

P = 288
FAST = {"max_rows": 20_000, "max_iter": 50}


def fleet(days: int, containers: int = 40, noise: float = 0.05, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Containers of sizes spread over three decades sharing one daily shape (1 + 0.8 sin), with relative noise."""
    rng = np.random.default_rng(seed)
    scale = np.geomspace(0.1, 100.0, containers)
    shape = 1.0 + 0.8 * np.sin(2 * np.pi * np.arange(days * P) / P)
    grid = scale[:, None] * shape[None, :] * (1.0 + noise * rng.standard_normal((containers, days * P)))
    return grid, scale


def next_day(scale: np.ndarray, days: int) -> np.ndarray:
    return scale[:, None] * (1.0 + 0.8 * np.sin(2 * np.pi * (days * P + np.arange(P)) / P))[None, :]


def test_a_fitted_model_forecasts_every_container_over_any_horizon() -> None:
    """(The scikit-learn contract checks are in test_forecast.py with the other forecasters.)"""
    fitted = GlobalQuantileBoostingForecaster(**FAST).fit(fleet(3, containers=5)[0])
    assert fitted.model_ is not None
    line = fitted.predict(2 * P)
    assert line.shape == (5, 2 * P) and np.all(line >= 0)
    np.testing.assert_array_equal(line[:, :P], line[:, P:])  # the forecast day repeats


def test_a_daily_sine_is_followed_at_every_scale() -> None:
    grid, scale = fleet(10)
    line = GlobalQuantileBoostingForecaster(quantile=0.9, **FAST).fit(grid).predict(P)
    truth = next_day(scale, 10)
    assert min(np.corrcoef(line[i], truth[i])[0, 1] for i in range(len(scale))) > 0.95
    ratio = np.median(line / truth, axis=1)
    assert np.all((ratio > 0.95) & (ratio < 1.3))  # about the 0.9 quantile of 5 % noise above the sine


def test_a_container_with_under_a_day_borrows_the_fleets_shape_at_its_own_scale() -> None:
    grid, scale = fleet(10)
    grid[0, : -P // 2] = np.nan  # only the last 12 h: the sine's low half
    line = GlobalQuantileBoostingForecaster(quantile=0.9, **FAST).fit(grid).predict(P)[0]
    truth = next_day(scale, 10)[0]
    assert np.corrcoef(line, truth)[0, 1] > 0.9  # its peak comes in the half it has never seen
    assert 0.8 < line.max() / truth.max() < 1.6
    assert np.all(line <= 1.5 * np.nanmax(grid[0]) + 1e-12)  # never above the ceiling on what it has shown


def test_a_fixed_seed_gives_the_same_line_and_a_grid_too_short_gives_nan() -> None:
    grid, _ = fleet(4, containers=10, noise=0.2)
    first = GlobalQuantileBoostingForecaster(**FAST).fit(grid).predict(P)
    np.testing.assert_array_equal(first, GlobalQuantileBoostingForecaster(**FAST).fit(grid).predict(P))
    short = GlobalQuantileBoostingForecaster(**FAST).fit(grid[:, : P // 2])
    assert short.model_ is None and np.isnan(short.predict(3)).all()


def test_the_setting_switches_the_candidate_off() -> None:
    def boosted(settings: ForecastSettings) -> int:
        return sum(isinstance(c, GlobalQuantileBoostingForecaster) for c in short_term_candidates(settings))

    assert boosted(ForecastSettings()) == 1
    assert boosted(ForecastSettings(use_boosting=False)) == 0
