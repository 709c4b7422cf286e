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

from models import ensemble
from models.ensemble import (
    CandidateScores,
    PeakForecaster,
    SelectedForecaster,
    blend_factors,
    choose_models,
    constant_candidates,
    labelled_costs,
    line_forecaster,
    matched_costs,
    model_name,
    selected_forecaster,
    selection_costs,
    short_term_candidates,
    shrink,
)
from models.forecast import (
    DecayedQuantileForecaster,
    FlatQuantileForecaster,
    MultiWindowQuantileForecaster,
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
    MultiWindowQuantileForecaster(),
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
    assert (
        DecayedQuantileForecaster(days=7, quantile=0.5, half_life_steps=P // 2).fit(series).predict(3)[0].tolist()
        == [5.0] * 3
    )
    assert FlatQuantileForecaster(days=7, quantile=0.5).fit(series).predict(1)[0, 0] == 1.0


def test_window_quantile_follows_a_daily_sine() -> None:
    grid = sine(7)[None, :]
    line = WindowQuantileForecaster(window_steps=0, floor_fraction=0.0).fit(grid).predict(P)[0]
    np.testing.assert_allclose(line, sine(1), atol=1e-9)


def short_term(settings: ForecastSettings, target: float = 0.01) -> SelectedForecaster:
    return selected_forecaster(settings, short_term_candidates(settings, target), target, False)


def jittered_sine(days: int, containers: int, seed: int) -> np.ndarray:
    """Daily sines whose peaks come up to 10 minutes early or late each day, with a little noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(containers):
        shifts = rng.integers(-2, 3, size=days)
        day = [np.roll(1.0 + np.sin(2 * np.pi * np.arange(P) / P), int(k)) for k in shifts]
        rows.append(np.concatenate(day) * rng.uniform(0.5, 2.0) + rng.normal(0, 0.01, days * P))
    return np.maximum(np.vstack(rows), 0.0)


def test_selected_line_follows_a_daily_sine_with_jitter() -> None:
    """Daily sines with a few minutes of jitter: the selected line follows the shape (a time-of-day candidate wins),
    costs far less than a flat line at the peak, and stays above the next day at the asked level."""
    grid = jittered_sine(23, 30, seed=0)
    model = short_term(ForecastSettings()).fit(grid[:, :-P])
    line, truth = model.predict(P), grid[:, -P:]
    chosen = model.model_names()[model.choice_[0]]
    assert chosen.startswith("WindowQuantileForecaster"), chosen
    # The line's trough is floored at half the flat quantile (quiet slots still burst), so it follows the peaks.
    assert np.mean([np.corrcoef(a, b)[0, 1] for a, b in zip(line, truth)]) > 0.9
    assert np.mean(truth > line) <= 0.02
    flat = np.max(grid[:, -2 * P : -P], axis=1, keepdims=True)
    assert line.sum() < 0.8 * (flat * np.ones(P)).sum()


def test_step_up_is_followed_within_an_hour() -> None:
    """Usage steps from 1 to 3 an hour before the decision: the line starts at or above the new level."""
    series = np.ones(23 * P)
    series[-12:] = 3.0
    model = short_term(ForecastSettings()).fit(series[None, :])
    assert np.all(model.predict(P)[0, :12] >= 3.0)


def test_white_noise_gives_a_calibrated_flat_line() -> None:
    rng = np.random.default_rng(1)
    grid = rng.normal(10.0, 1.0, size=(40, 23 * P))
    for target in (0.01, 0.05):
        line = short_term(ForecastSettings(), target).fit(grid).predict(P)
        fresh = rng.normal(10.0, 1.0, size=line.shape)
        assert np.mean(fresh > line) == pytest.approx(target, abs=0.5 * target)
        assert np.std(line, axis=1).max() < 0.5  # flat: far less than the noise's own spread of 1


def test_lines_are_built_for_the_asked_level() -> None:
    """At 5 % the line sits lower than at 1 % (not one line scaled), and each one's violation is near its level."""
    rng = np.random.default_rng(4)
    grid = rng.gamma(2.0, 1.0, size=(40, 24 * P))
    past, future = grid[:, :-P], grid[:, -P:]
    strict = short_term(ForecastSettings(), 0.01).fit(past).predict(P)
    loose = short_term(ForecastSettings(), 0.05).fit(past).predict(P)
    assert np.all(loose <= strict) and np.mean(loose < strict) > 0.9  # the first hour may share the recent max
    assert np.mean(future > strict) == pytest.approx(0.01, abs=0.006)
    assert np.mean(future > loose) == pytest.approx(0.05, abs=0.02)


def test_a_stopped_container_is_stale_not_extrapolated() -> None:
    grid = np.ones((2, 23 * P))
    grid[1, -4 * P :] = np.nan  # stopped four days ago (stale after three)
    line = short_term(ForecastSettings()).fit(grid).predict(P)
    assert np.isfinite(line[0]).all()
    assert np.isnan(line[1]).all()


def test_cold_start_is_bounded_by_what_was_seen() -> None:
    grid = np.full((2, 10 * P), np.nan)
    grid[0, -36:] = 2.0  # three hours of history
    line = SelectedForecaster(cold_start_factor=1.5).fit(grid).predict(P)
    np.testing.assert_allclose(line[0], 3.0)
    assert np.isnan(line[1]).all()


def test_matched_cost_is_the_overprovision_at_the_target_violation() -> None:
    rng = np.random.default_rng(2)
    usage = rng.uniform(0, 1, size=(5, 3, P))  # origins x containers x steps
    costs = matched_costs(np.full((1, *usage.shape), 0.5), usage, 0.01)
    constant = matched_costs(np.full((1, 5, 3, 1), 5.0), usage, 0.01)  # a constant line is one value
    ratio = np.sort((usage / 0.5).ravel())
    alpha = ratio[int(np.ceil(0.99 * ratio.size)) - 1]
    assert costs[0, 0] == pytest.approx(alpha * 0.5 * usage.size / usage.sum() - 1)
    # Scaled lines are the same shape: equal cost whatever their level; the p90 container violation is near 1 %.
    assert constant[0, 0] == pytest.approx(costs[0, 0])
    assert costs[0, 1] == pytest.approx(0.01, abs=0.01)


def test_fleet_chooses_and_a_group_only_with_strong_evidence() -> None:
    rng = np.random.default_rng(5)
    usage = rng.uniform(0.5, 1.0, size=(7, 60, P))
    usage[:, 40:] *= np.where(rng.random((7, 20, P)) < 0.05, 4.0, 1.0)  # a bursty third
    flat = np.broadcast_to(usage.max(axis=2, keepdims=True).mean(axis=0, keepdims=True), usage.shape)
    lines = np.stack([flat, usage * 1.5 + 0.2 * rng.random(usage.shape)])  # the second is near the truth
    groups = CandidateScores().groups(usage, 3)
    assert set(groups[40:].tolist()) == {2}
    costs = labelled_costs(list(lines), usage, 0.01, groups, 3)
    choice, fleet, per_group = choose_models(costs, groups, 0.01, min_gain=0.1, min_containers=20, reference=0)
    assert fleet.shape == (2, 2) and per_group.shape == (3, 2, 2)
    assert set(choice.tolist()) == {1}
    # A group smaller than the minimum never chooses on its own.
    few = choose_models(costs, groups, 0.01, min_gain=0.1, min_containers=100, reference=0)[0]
    assert len(set(few.tolist())) == 1


def test_calibration_shrinks_a_container_toward_its_group_and_the_group_toward_the_fleet() -> None:
    assert shrink(np.array([4.0]), np.array([0.0]), np.array([2.0]), 10.0)[0] == 2.0
    assert shrink(np.array([4.0]), np.array([10.0]), np.array([1.0]), 10.0)[0] == pytest.approx(2.0)
    factors = blend_factors(
        own=np.array([4.0, np.nan]),
        samples=np.array([1e9, 0.0]),
        groups=np.array([0, 1]),
        group_factor=np.array([2.0, 3.0]),
        group_samples=np.array([0.0, 1e9]),
        fleet=1.5,
        prior_samples=1e9,
        group_prior_samples=1e9,
        factor_range=(0.25, 4.0),
    )
    # container 0: half own (4), half its group, which has no samples of its own (the fleet's 1.5)
    assert factors[0] == pytest.approx(np.sqrt(4.0 * 1.5))
    # container 1: no own samples: its group, half the group's 3 and half the fleet's 1.5
    assert factors[1] == pytest.approx(np.sqrt(3.0 * 1.5))


def test_selection_costs_of_constant_lines_match_the_direct_sum() -> None:
    rng = np.random.default_rng(6)
    usage = rng.uniform(0, 2, size=(3, 4, 50))
    usage[0, 0, :10] = np.nan
    levels = rng.uniform(0.5, 1.5, size=(2, 3, 4, 1))
    fast = selection_costs(levels, usage, 0.05)
    known = ~np.isnan(usage)
    over = np.where(known, np.maximum(usage - levels, 0), 0)
    under = np.where(known, np.maximum(levels - usage, 0), 0)
    direct = (0.95 * over + 0.05 * under).sum(axis=(1, 3)) / np.nansum(usage, axis=(0, 2))
    np.testing.assert_allclose(fast, direct)


def test_peak_forecast_is_a_point_forecast_near_the_daily_max() -> None:
    rng = np.random.default_rng(7)
    days = rng.uniform(0.8, 1.2, size=(50, 15))
    grid = np.repeat(days, P, axis=1) * rng.uniform(0.5, 1.0, size=(50, 15 * P))
    model = PeakForecaster().fit(grid[:, :-P])
    actual = grid[:, -P:].max(axis=1)
    error = np.abs(model.predict() - actual) / actual
    assert np.median(error) < 0.2
    assert 0.2 <= np.mean(actual > model.predict()) <= 0.7


def test_selected_forecaster_records_choice_and_costs() -> None:
    grid = np.vstack([sine(23), np.random.default_rng(3).uniform(0, 1, 23 * P)])
    settings = ForecastSettings()
    model = short_term(settings).fit(grid)
    assert model.costs_.shape == (len(short_term_candidates(settings, 0.01)), 2)
    assert model.choice_.shape == (2,) and model.factors_.shape == (2,)
    assert len(model.model_names()) == model.costs_.shape[0]
    constant = selected_forecaster(settings, short_term_candidates(settings, 0.02), 0.02, True).fit(grid)
    line = constant.predict(P)
    assert np.all(line == line[:, :1])


@pytest.mark.parametrize("poison", [50.0, 0.01])
def test_calibration_leaves_out_containers_beyond_the_guard(poison: float) -> None:
    # Issue 13: a few poisoned containers moved every clean container's factor through the pooled quantile.
    rng = np.random.default_rng(11)
    clean = rng.uniform(0.5, 1.0, (30, 14 * P)) * rng.uniform(0.5, 5.0, (30, 1))
    clean[rng.random(clean.shape) < 0.02] *= 1.6  # bursts: the clean fleet's factor is well above 1
    evil = rng.uniform(0.5, 1.0, (3, 14 * P))
    evil[:, -7 * P :] *= poison  # the out-of-sample week is far from its lines
    model = selected_forecaster(
        ForecastSettings(), [FlatQuantileForecaster(days=7.0, quantile=0.99)], 0.01, constant=False
    )
    alone = clone(model).fit(clean)
    mixed = clone(model).fit(np.vstack([clean, evil]))
    assert mixed.outliers_[30:].all() and not mixed.outliers_[:30].any()
    # Documented tolerance (docs/input-validation.md): clean factors move by under 0.1 %.
    assert mixed.fleet_factor_ == pytest.approx(alone.fleet_factor_, rel=1e-3)
    np.testing.assert_allclose(mixed.factors_[:30], alone.factors_, rtol=1e-3)
    assert np.isfinite(mixed.predict(P)).all()


def test_window_quantiles_in_blocks_of_rows_equal_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are sorted in blocks to bound memory (issue 17): the profile is the one a single pass gives."""
    import models.forecast as forecast

    rng = np.random.default_rng(3)
    grid = rng.gamma(2.0, 1.0, size=(37, 9 * P))
    grid[rng.random(grid.shape) < 0.1] = np.nan
    whole = WindowQuantileForecaster(window_steps=12).fit(grid).profile_
    monkeypatch.setattr(forecast, "WINDOW_BLOCK_VALUES", 5 * P * 7 * 25)  # blocks of 5 rows
    assert np.array_equal(WindowQuantileForecaster(window_steps=12).fit(grid).profile_, whole, equal_nan=True)


def test_each_line_has_its_candidates_shape_and_horizon() -> None:
    """The one place training, `backtest` and the node backtest take their lines from."""
    settings = ForecastSettings(short_term_target_violation=0.05, selection_groups=2, fairness_tolerance=0.5)
    short, request, long_term = (line_forecaster(settings, line) for line in ("short_term", "request", "long_term"))
    assert short.model_names() == [model_name(c) for c in short_term_candidates(settings, 0.05)]
    assert (
        request.model_names() == long_term.model_names() == [model_name(c) for c in constant_candidates(settings, 0.01)]
    )
    assert [(f.constant, f.horizon_days, f.target_violation) for f in (short, request, long_term)] == [
        (False, 1, 0.05),
        (True, 1, 0.01),
        (True, 7, 0.01),
    ]
    assert {(f.groups, f.fairness_tolerance) for f in (short, request, long_term)} == {(2, 0.5)}


def test_one_group_needs_no_burstiness(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(_: object) -> None:
        raise AssertionError("burstiness computed for one group")

    monkeypatch.setattr(ensemble, "burstiness", refused)
    usage = np.random.default_rng(3).uniform(size=(7, 5, 7 * P))
    assert CandidateScores().groups(usage, 1).tolist() == [0] * 5
    with pytest.raises(AssertionError, match="burstiness"):
        CandidateScores().groups(usage, 3)
