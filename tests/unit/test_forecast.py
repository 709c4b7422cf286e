"""Forecast models and their selection on synthetic series with known answers, plus the estimator contract."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import (
    check_get_params_invariance,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_set_params,
)

from models.boosting import GlobalQuantileBoostingForecaster
from models.ensemble import (
    SelectedForecaster,
    calibration_factors,
    choose_models,
    selected_forecaster,
    selection_costs,
    short_term_candidates,
)
from models.forecast import (
    DecayedQuantileForecaster,
    FlatQuantileForecaster,
    StlForecaster,
    WindowQuantileForecaster,
    nan_quantile,
    usage_grid,
)
from recommender.settings import ForecastSettings

P = 288
ESTIMATORS = [
    FlatQuantileForecaster(),
    DecayedQuantileForecaster(),
    WindowQuantileForecaster(),
    StlForecaster(),
    GlobalQuantileBoostingForecaster(),
    SelectedForecaster(),
]


def sine(days: int, shift: int = 0) -> np.ndarray:
    t = np.arange(days * P + shift)
    return 1.0 + np.sin(2 * np.pi * t / P)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: type(e).__name__)
def test_estimator_contract(estimator: object) -> None:
    name = type(estimator).__name__
    check_parameters_default_constructible(name, estimator)
    check_no_attributes_set_in_init(name, estimator)
    check_get_params_invariance(name, estimator)
    check_set_params(name, estimator)
    with pytest.raises(NotFittedError):
        clone(estimator).predict(P)  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        clone(estimator).fit(np.ones(10))  # type: ignore[attr-defined]


def test_nan_quantile_matches_numpy_and_ignores_nan() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=(5, 101))
    for q in (0.0, 0.3, 0.99, 1.0):
        np.testing.assert_allclose(nan_quantile(values, q), np.quantile(values, q, axis=1, method="inverted_cdf"))
    values[:, 50:] = np.nan
    np.testing.assert_allclose(nan_quantile(values, 1.0), np.nanmax(values, axis=1))
    assert np.isnan(nan_quantile(np.full((1, 3), np.nan), 0.5))[0]


def test_usage_grid_takes_the_max_per_step_and_ends_before_the_end() -> None:
    grid = usage_grid(
        np.array([0, 0, 1, 0]), np.array([0.0, 100.0, 299.0, 600.0]), np.array([1.0, 3.0, 2.0, 9.0]), 2, 600.0, 2, 300
    )
    np.testing.assert_array_equal(grid, [[3.0, np.nan], [2.0, np.nan]])


def test_decayed_quantile_follows_a_level_shift_that_the_flat_one_ignores() -> None:
    series = np.r_[np.ones(6 * P), np.full(P, 5.0)][None, :]
    assert DecayedQuantileForecaster(days=7, quantile=0.5, half_life_steps=P // 2).fit(series).predict(3)[0].tolist() == [5.0] * 3
    assert FlatQuantileForecaster(days=7, quantile=0.5).fit(series).predict(1)[0, 0] == 1.0


def test_window_quantile_follows_a_daily_sine() -> None:
    grid = sine(7)[None, :]
    line = WindowQuantileForecaster(window_steps=0, floor_fraction=0.0).fit(grid).predict(P)[0]
    np.testing.assert_allclose(line, sine(1), atol=1e-9)


def test_selected_line_follows_a_daily_sine() -> None:
    """A pure daily sine: the selected, calibrated line follows it closely (not a flat line at its max)."""
    grid = sine(15)[None, :]
    model = selected_forecaster(ForecastSettings(), short_term_candidates(ForecastSettings()), 0.01, False).fit(grid)
    line = model.predict(P)[0]
    truth = sine(1)
    assert np.corrcoef(line, truth)[0, 1] > 0.95
    assert np.mean(line >= truth - 1e-9) > 0.95
    assert np.mean(line - truth) < 0.25


def test_step_up_is_followed_within_an_hour() -> None:
    """Usage steps from 1 to 3 an hour before the decision: the line starts at or above the new level."""
    series = np.ones(10 * P)
    series[-12:] = 3.0
    model = selected_forecaster(ForecastSettings(), short_term_candidates(ForecastSettings()), 0.01, False).fit(series[None, :])
    assert np.all(model.predict(P)[0, :12] >= 3.0)


def test_white_noise_gives_a_calibrated_flat_line() -> None:
    rng = np.random.default_rng(1)
    grid = rng.normal(10.0, 1.0, size=(20, 15 * P))
    settings = ForecastSettings()
    model = selected_forecaster(settings, short_term_candidates(settings), 0.01, False).fit(grid)
    line = model.predict(P)
    fresh = rng.normal(10.0, 1.0, size=line.shape)
    assert 0.002 <= np.mean(fresh > line) <= 0.03
    assert np.std(line, axis=1).max() < 0.5  # flat: far less than the noise's own spread of 1


def test_cold_start_is_bounded_by_what_was_seen() -> None:
    grid = np.full((2, 10 * P), np.nan)
    grid[0, -36:] = 2.0  # three hours of history
    line = SelectedForecaster(cold_start_factor=1.5).fit(grid).predict(P)
    np.testing.assert_allclose(line[0], 3.0)
    assert np.isnan(line[1]).all()


def test_selection_prefers_the_cheaper_model_and_calibration_hits_the_target() -> None:
    rng = np.random.default_rng(2)
    usage = rng.uniform(0, 1, size=(5, 3, P))  # origins x containers x steps
    lines = np.stack([np.full_like(usage, 0.99), np.full_like(usage, 5.0)])
    costs = selection_costs(lines, usage, 0.01, 0.0)
    assert choose_models(costs).tolist() == [0, 0, 0]
    factors = calibration_factors(lines[1], usage, 0.05, 1.0, (0.01, 10.0))
    calibrated = lines[1] * factors[None, :, None]
    assert np.mean(usage > calibrated) == pytest.approx(0.05, abs=0.02)


def test_selected_forecaster_records_choice_and_costs() -> None:
    grid = np.vstack([sine(15), np.random.default_rng(3).uniform(0, 1, 15 * P)])
    model = selected_forecaster(ForecastSettings(), short_term_candidates(ForecastSettings()), 0.01, False).fit(grid)
    assert model.costs_.shape == (len(short_term_candidates(ForecastSettings())), 2)
    assert model.choice_.shape == (2,) and model.factors_.shape == (2,)
    assert len(model.model_names()) == model.costs_.shape[0]
    constant = selected_forecaster(ForecastSettings(), short_term_candidates(ForecastSettings()), 0.02, True).fit(grid)
    line = constant.predict(P)
    assert np.all(line == line[:, :1])
