"""The learned live line: features that cannot see the block they forecast, a blend that is never fitted worse than
its best input, online calibration that moves toward the asked level, and `replay` that issues lines from the past
only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from models.live_line import (
    BLEND_STATISTICS,
    BLEND_WEIGHTS,
    FEATURE_NAMES,
    STEPS_PER_DAY,
    STEPS_PER_WEEK,
    AdaptiveScale,
    LiveLineForecaster,
    MatchedScores,
    UsableRows,
    blend_inputs,
    live_features,
    matched_cost,
    matched_scores,
    rows_features,
    usable_rows,
)
from models.nodes import node_live_line
from pipelines.replay import ReplayPlan, replay_resource, run_replay
from pipelines.settings import TrainingSettings
from recommender.errors import ConfigurationError
from recommender.progress import quiet
from recommender.settings import ColocationSettings, LiveLineSettings

DAY = 86400
START = 1_700_006_400  # a midnight, UTC


def bursty_grid(rows: int = 30, days: int = 12, seed: int = 0) -> np.ndarray:
    """Usage with a daily cycle, noise and bursts that cluster in time (what makes a recent max informative)."""
    rng = np.random.default_rng(seed)
    steps = days * STEPS_PER_DAY
    phase = 2 * np.pi * np.arange(steps) / STEPS_PER_DAY
    level = rng.uniform(0.2, 4.0, rows)[:, None]
    cycle = 1 + 0.4 * np.sin(phase)[None, :]
    bursts = np.repeat(rng.random((rows, steps // 12)) < 0.03, 12, axis=1) * rng.uniform(1, 3, (rows, 1))
    grid = level * (cycle + bursts + rng.gamma(2.0, 0.05, (rows, steps)))
    grid[rng.random(grid.shape) < 0.01] = np.nan
    return grid


@settings(max_examples=40, deadline=None)
@given(
    grid=arrays(np.float64, (3, 400), elements=st.floats(0, 1e6) | st.just(np.nan)),
    position=st.integers(0, 399),
    later=st.floats(0, 1e9),
)
def test_features_read_only_the_columns_before_the_issue(grid: np.ndarray, position: int, later: float) -> None:
    before, scale = live_features(grid, position, 12, START)
    changed = grid.copy()
    changed[:, position:] = later
    after, scale_after = live_features(changed, position, 12, START)
    np.testing.assert_array_equal(before, after)
    np.testing.assert_array_equal(scale, scale_after)
    assert before.shape == (3, len(FEATURE_NAMES))
    assert np.array_equal(usable_rows(grid, position, 12), usable_rows(changed, position, 12))


@pytest.mark.parametrize("position", [1, 12, STEPS_PER_DAY + 5, STEPS_PER_WEEK, STEPS_PER_WEEK + 1, 12 * STEPS_PER_DAY])
def test_the_features_of_some_rows_are_those_of_the_rows_copied_whole(position: int) -> None:
    """Issue 41: the training's origins copy only the week the features read, not each row's whole grid."""
    grid = bursty_grid(rows=9, seed=4)
    grid[2, position - 1 :] = np.nan  # a row with no sample at the issue
    rows = np.array([7, 2, 5, 0])
    features, scale = rows_features(grid, rows, position, 12, START + 7 * 3600)
    whole, whole_scale = live_features(grid[rows], position, 12, START + 7 * 3600)
    np.testing.assert_array_equal(features, whole)
    np.testing.assert_array_equal(scale, whole_scale)


@settings(max_examples=60, deadline=None)
@given(
    grid=arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(1, 2400)),
        elements=st.sampled_from([np.nan, 0.0, -1.0, 0.5, 3.0, np.inf, -np.inf]),
    ),
    min_history=st.integers(1, 300),
)
def test_running_counts_find_the_usable_rows_of_every_position(grid: np.ndarray, min_history: int) -> None:
    """The training's rolling origins read `usable_rows` from running counts: the same rows at every position."""
    usable = UsableRows(grid, min_history)
    for position in range(0, grid.shape[1] + 1, 7):
        np.testing.assert_array_equal(usable(position), usable_rows(grid, position, min_history))


@settings(max_examples=60, deadline=None)
@given(
    line=arrays(np.float64, 50, elements=st.floats(0.01, 100)),
    # Subnormal usage (2e-313 cores) has a few bits of precision left: 3 x its ratio is not 3 x to 1e-9.
    usage=arrays(np.float64, 50, elements=st.floats(0, 100, allow_subnormal=False)),
    level=st.sampled_from([0.01, 0.05, 0.2]),
)
def test_matched_cost_is_invariant_to_the_line_s_scale(line: np.ndarray, usage: np.ndarray, level: float) -> None:
    if usage.sum() <= 0:
        return
    weights = np.ones_like(line)
    one = matched_cost(line, usage, weights, level)
    assert matched_cost(3.0 * line, usage, weights, level) == pytest.approx(one, rel=1e-9, abs=1e-9)
    # No line does better than the usage itself at a 0 risk... and a line of the usage has no room at all, but for
    # the floor that keeps it positive where usage is 0 (large beside a tiny total: 49 x 1e-9 against 0.03) and the
    # quantile's interpolation just below the top ratio (1 - 49 x 1e-9 of a step).
    floored = np.maximum(usage, 1e-9)
    room = matched_cost(floored, usage, weights, 1e-9)
    assert -1e-7 <= room <= floored.sum() / usage.sum() - 1.0 + 1e-9


def test_matched_scores_kept_for_many_lines_are_each_line_s_own() -> None:
    """Issue 41: the blend's fit scores a thousand lines over the same rows with one `MatchedScores`; each score is
    the line's room at the matched level and the p90 over containers of their share of samples above it."""
    rng = np.random.default_rng(5)
    usage, weights = rng.gamma(2.0, 1.0, 5000), rng.uniform(0.5, 3.0, 5000)
    owners = np.sort(rng.choice(np.arange(0, 80, 2), 5000))  # every other container has no row
    scores = MatchedScores(usage, weights, owners, 0.05)
    for _ in range(4):
        line = usage * rng.lognormal(0.3, 0.5, usage.size)
        factor = np.quantile(usage / line, 0.95)
        room = factor * np.sum(line * weights) / np.sum(usage * weights) - 1.0
        above = np.array([np.mean(usage[owners == o] / line[owners == o] > factor) for o in np.unique(owners)])
        cost, p90 = scores(line)
        assert cost == pytest.approx(room, rel=1e-12) and p90 == pytest.approx(np.quantile(above, 0.9), rel=1e-12)
        assert (cost, p90) == matched_scores(line, usage, weights, owners, 0.05)


def test_the_fitted_blend_is_no_dearer_than_its_best_statistic_on_its_training_rows() -> None:
    grid = bursty_grid()
    model = LiveLineForecaster(target_violation=0.05, training_days=6).fit(grid, grid_end=START + 12 * DAY)
    assert model.coef_.shape == (len(BLEND_STATISTICS),)
    assert model.training_cost_ <= min(model.baseline_costs_.values()) + 1e-9
    # ... and it gave up on no more containers than its best statistic plus the tolerance.
    features, targets, weights, owners = model.training_set([grid], START + 12 * DAY)
    line = model.level_ * np.exp(blend_inputs(features) @ model.coef_)
    cost, p90 = matched_scores(line, targets, weights, owners, 0.05)
    assert cost == matched_cost(line, targets, weights, 0.05)
    assert p90 <= model.fairness_limit_ + 1e-12
    line = model.predict(grid, issued_at=START + 12 * DAY)
    assert line.shape == (grid.shape[0],) and np.all(np.isfinite(line)) and np.all(line > 0)


def test_the_blend_kept_is_as_fair_as_its_statistic_on_the_newest_rows_it_was_not_fitted_on() -> None:
    """Issue 38: the fit's own days flatter the blend's p90 container violation, so the newest third of the rows is
    held out and the blend drawn toward its best statistic until it is as fair there; with nothing held out it is
    kept whole. The two fits share everything else."""
    grid, end = bursty_grid(rows=40, seed=3), START + 12 * DAY
    model = LiveLineForecaster(target_violation=0.05, training_days=6, validation_fraction=1 / 3).fit(grid, end)
    whole = LiveLineForecaster(target_violation=0.05, training_days=6).fit(grid, grid_end=end)
    assert whole.shrinkage_ == 1.0 and model.shrinkage_ in (*BLEND_WEIGHTS, 0.0)
    features, targets, weights, owners = model.training_set([grid], end)
    inputs, newest = blend_inputs(features), round(targets.size / 3)
    start = np.zeros(len(BLEND_STATISTICS))
    start[BLEND_STATISTICS.index(min(model.baseline_costs_, key=model.baseline_costs_.__getitem__))] = 1.0

    def fresh_p90(coef: np.ndarray) -> float:
        part = slice(0, newest)
        return matched_scores(np.exp(inputs[part] @ coef), targets[part], weights[part], owners[part], 0.05)[1]

    assert fresh_p90(model.coef_) <= fresh_p90(start) + model.fairness_tolerance + 1e-12
    cost, p90 = matched_scores(np.exp(inputs @ model.coef_), targets, weights, owners, 0.05)
    assert cost <= min(model.baseline_costs_.values()) + 1e-12 and p90 <= model.fairness_limit_ + 1e-12


def test_a_capped_training_set_is_the_whole_set_s_random_subset_in_order() -> None:
    """Issue 41: the cap is drawn before each container's features are repeated for its block's steps (the whole set
    of a 1,000-container fleet took 1.4 GB): the rows kept are those a subset of the whole set would keep, however
    the fleet is cut into grids."""
    grids, end = [bursty_grid(rows=13, seed=1), bursty_grid(rows=9, seed=2)], START + 12 * DAY
    model = LiveLineForecaster(training_days=6)
    whole = model.training_set(grids, end)
    cap = whole[1].size // 3
    keep = np.sort(np.random.default_rng(model.random_state).choice(whole[1].size, cap, replace=False))
    for got, expected in zip(model.training_set(grids, end, max_rows=cap), whole, strict=True):
        np.testing.assert_array_equal(got, expected[keep])
    for got, expected in zip(model.training_set(grids, end, max_rows=whole[1].size), whole, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_live_line_pickled_before_the_held_out_check_loads_as_the_whole_blend_it_was() -> None:
    grid = bursty_grid()
    model = LiveLineForecaster(target_violation=0.05, training_days=6).fit(grid, grid_end=START + 12 * DAY)
    assert model.shrinkage_ == 1.0  # the default holds nothing out: the blend is what it was before the option
    old = {k: v for k, v in model.__dict__.items() if k not in ("validation_fraction", "shrinkage_")}
    loaded = LiveLineForecaster.__new__(LiveLineForecaster)
    loaded.__setstate__(old)
    assert loaded.get_params()["validation_fraction"] == 0.0 and loaded.shrinkage_ == 1.0
    np.testing.assert_array_equal(loaded.predict(grid, START + 12 * DAY), model.predict(grid, START + 12 * DAY))


def test_quantile_trees_are_fitted_out_of_fold_and_feed_the_blend() -> None:
    grid = bursty_grid(rows=40)
    model = LiveLineForecaster(
        target_violation=0.05, training_days=6, quantile_trees=True, min_samples_leaf=200, max_iter=20
    ).fit(grid, grid_end=START + 12 * DAY)
    assert len(model.trees_) == 2 and model.coef_.shape == (len(BLEND_STATISTICS) + 1,)
    assert np.all(np.isfinite(model.predict(grid, issued_at=START + 12 * DAY)))


def test_too_little_history_is_refused_not_fitted() -> None:
    with pytest.raises(ValueError, match="too little history"):
        LiveLineForecaster().fit(bursty_grid(rows=2, days=1), grid_end=START + DAY)


def test_cold_starts_and_gaps_get_no_learned_line() -> None:
    grid = bursty_grid()
    model = LiveLineForecaster(target_violation=0.05, training_days=6).fit(grid, grid_end=START + 12 * DAY)
    grid[0, -12:] = np.nan  # silent for the last hour: a gap
    grid[1, :-100] = np.nan  # 100 samples in all: a cold start
    line = model.predict(grid, issued_at=START + 12 * DAY)
    assert np.isnan(line[0]) and np.isnan(line[1]) and np.all(np.isfinite(line[2:]))


@settings(max_examples=60, deadline=None)
@given(
    misses=st.integers(0, 12),
    level=st.sampled_from([0.01, 0.05]),
    rate=st.floats(0.01, 5),
)
def test_calibration_rises_after_misses_and_sinks_after_none(misses: int, level: float, rate: float) -> None:
    state = AdaptiveScale(level, rate, rate, steps_per_hour=12)
    lines = np.ones(4)
    observed = np.full((4, 12), 0.5)
    observed[0, :misses] = 2.0
    after = state.updated(lines, observed)
    share = misses / 48
    assert np.sign(after.fleet) == np.sign(share - level) or share == level
    assert after.factors(4)[0] >= after.factors(4)[1]
    # Rows without a line or a sample teach nothing.
    assert state.updated(np.full(4, np.nan), observed) == state


@settings(max_examples=60, deadline=None)
@given(
    misses=st.integers(0, 12),
    level=st.sampled_from([0.01, 0.05]),
    rise=st.floats(0, 1),
    sink=st.floats(0, 1),
)
def test_a_container_s_factor_rises_and_sinks_at_rates_of_their_own(
    misses: int, level: float, rise: float, sink: float
) -> None:
    """Above the level a container's log-factor moves at `own_rate` x (share - P), below it at `own_sink_rate`, less
    the containers' mean move: their factors move against each other only, and the fleet's is as without them.
    Without a sink rate (a state pickled before it) a factor sinks as fast as it rises."""
    observed = np.full((2, 12), 0.5)
    observed[0, :misses] = 2.0  # the other row never reaches its line
    share = misses / 12
    state = AdaptiveScale(level, 0.2, rise, steps_per_hour=12, own_sink_rate=sink)
    after = state.updated(np.ones(2), observed)
    assert after.own is not None
    moved = (rise if share > level else sink) * (share - level)
    assert after.own[0] - after.own[1] == pytest.approx(moved + sink * level, abs=1e-12)
    assert after.own.sum() == pytest.approx(0.0, abs=1e-12)
    assert after.fleet == pytest.approx(AdaptiveScale(level, 0.2, 0.0).updated(np.ones(2), observed).fleet)
    before = AdaptiveScale(level, 0.2, rise, steps_per_hour=12).updated(np.ones(2), observed).own
    assert before is not None and before[0] - before[1] == pytest.approx(rise * share, abs=1e-12)


def test_a_live_line_pickled_before_the_sink_rate_sinks_as_fast_as_it_rises() -> None:
    grid = bursty_grid()
    model = LiveLineForecaster(target_violation=0.05, training_days=6, own_adaptation_rate=0.03)
    old = {k: v for k, v in model.fit(grid, grid_end=START + 12 * DAY).__dict__.items() if k != "own_sink_rate"}
    loaded = LiveLineForecaster.__new__(LiveLineForecaster)
    loaded.__setstate__(old)
    assert loaded.initial_scale().own_sink_rate == 0.03
    assert LiveLineForecaster().initial_scale().own_sink_rate == 0.08  # today's default: faster than the rise


@settings(max_examples=60, deadline=None)
@given(
    misses=st.integers(0, 12),
    level=st.sampled_from([0.01, 0.05]),
    rate=st.floats(0.01, 1),
)
def test_states_pickled_with_an_absolute_fleet_rate_move_as_they_did(misses: int, level: float, rate: float) -> None:
    """A calibration stored before the fleet's move was relative to the level (`rate` x (share - P)) and a fitted
    line stored with `adaptation_rate` load as a relative rate of that x P: their factors move exactly as before, and
    a relative rate moves as fast at 1 % as at 5 % for the same share of P."""
    observed = np.full((2, 12), 0.5)
    observed[0, :misses] = 2.0
    share = misses / 24
    old = AdaptiveScale.__new__(AdaptiveScale)
    old.__setstate__({"target_violation": level, "rate": rate, "own_rate": 0.0, "horizon_steps": 12, "fleet": 0.1})
    assert old.fleet_rate == pytest.approx(rate * level) and old.fleet == 0.1
    assert old.updated(np.ones(2), observed).fleet == pytest.approx(0.1 + rate * (share - level))
    model = LiveLineForecaster(target_violation=level)
    state = {k: v for k, v in model.__dict__.items() if k != "fleet_adaptation_rate"} | {"adaptation_rate": rate}
    loaded = LiveLineForecaster.__new__(LiveLineForecaster)
    loaded.__setstate__(state)
    assert loaded.initial_scale().fleet_rate == pytest.approx(rate * level)
    # Twice the level's share above the line (100 samples, one interval): the same move at 1 % as at 5 %.
    for p in (0.01, 0.05):
        above = np.full((1, 100), 0.5)
        above[0, : int(round(200 * p))] = 2.0
        assert AdaptiveScale(p, 0.0025, 0.0, steps_per_hour=100).updated(np.ones(1), above).fleet == pytest.approx(
            0.0025
        )


@settings(max_examples=60, deadline=None)
@given(
    observed=arrays(np.float64, (6, 12), elements=st.floats(0, 3) | st.just(np.nan)),
    copies=st.integers(1, 4),
    level=st.sampled_from([0.01, 0.05]),
)
def test_a_container_s_identical_pods_calibrate_as_its_one_pod(observed: np.ndarray, copies: int, level: float) -> None:
    """Counting each pod's samples (`owners`) with every pod alike is counting the container's: its own and the
    fleet's factors move as with one pod, so a one-pod fleet is calibrated as before."""
    state = AdaptiveScale(level, 0.2, 0.05, steps_per_hour=12)
    lines = np.array([1.0, 1.0, np.nan, 2.0, 0.5, 1.5])
    alone = state.updated(lines, observed)
    owners = np.repeat(np.arange(6), copies)
    pods = state.updated(lines, np.repeat(observed, copies, axis=0), owners)
    assert pods.fleet == pytest.approx(alone.fleet, abs=1e-12)
    np.testing.assert_allclose(pods.factors(6), alone.factors(6), rtol=1e-12)


def test_calibration_counts_every_pod_s_samples_not_the_busiest_pod_s() -> None:
    """One pod always above its container's line and three below: a quarter of the pods' samples miss (the share
    the harness and VPA's histograms count), while every step's busiest pod does."""
    state = AdaptiveScale(0.05, 0.05, 1.0, steps_per_hour=12)  # the fleet moves by 0.05 x (share / 5 % - 1)
    lines = np.ones(2)
    observed = np.full((8, 12), 0.5)
    observed[[0, 4]] = 2.0
    owners = np.repeat([0, 1], 4)
    per_pod = state.updated(lines, observed, owners)
    assert per_pod.fleet == pytest.approx(0.25 - 0.05)
    busiest = state.updated(lines, np.full((2, 12), 2.0))
    assert busiest.fleet == pytest.approx(1.0 - 0.05)


def test_online_calibration_brings_a_biased_line_to_the_asked_level() -> None:
    """A line fitted for 5 % on a calm week, run on a fleet that became burstier: the adaptive factor restores the
    level within half a point over the replayed days, where the fixed fit misses it."""
    calm, bursty = bursty_grid(rows=60, days=10, seed=1), bursty_grid(rows=60, days=10, seed=2) * 1.0
    bursty[:, 8 * STEPS_PER_DAY :] *= 1 + 0.8 * (np.random.default_rng(3).random((60, 2 * STEPS_PER_DAY)) < 0.2)
    grid = np.concatenate([calm[:, : 8 * STEPS_PER_DAY], bursty[:, 8 * STEPS_PER_DAY :]], axis=1)
    start, end = START + 8 * DAY, START + 10 * DAY
    plan = ReplayPlan(start, end, 3600, 30 * DAY)
    shares = {}
    for rate in (0.0, 0.1):
        model = LiveLineForecaster(target_violation=0.05, training_days=6, fleet_adaptation_rate=rate)
        lines = replay_resource(grid, START, plan, model, quiet)
        usage = grid[:, 8 * STEPS_PER_DAY :].reshape(60, -1, 12)
        shares[rate] = float(np.nanmean(usage > lines.T[:, :, None]))
    assert abs(shares[0.1] - 0.05) <= 0.005 < abs(shares[0.0] - 0.05)


def tidy(grid: np.ndarray, resource: str = "cpu_cores") -> pd.DataFrame:
    rows, steps = grid.shape
    times = START + 300 * np.arange(steps)
    frames = [
        pd.DataFrame(
            {
                "timestamp": times,
                "namespace": "ns",
                "workload": f"w{r:02d}",
                "pod": f"w{r:02d}-0",
                "container": "main",
                "cpu_cores": grid[r],
                "memory_bytes": grid[r] * 1e9,
            }
        )
        for r in range(rows)
    ]
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("every", [3600, 300])
def test_replay_issues_every_interval_from_the_past_only(tmp_path: Path, every: int) -> None:
    """No peeking: every sample from a cut on is changed, and every line issued before the cut stays as it was; at
    the issue's hourly contract and at the live loop's own cadence (a line every 5-minute step), the cut inside an
    hour."""
    grid = bursty_grid(rows=12, days=10)
    original = tidy(grid)
    original.to_csv(tmp_path / "a.csv", index=False)
    cut = START + 9 * DAY + 5 * 3600 + 25 * 60
    changed = original.copy()
    later = changed["timestamp"] >= cut
    changed.loc[later, ["cpu_cores", "memory_bytes"]] *= 7.0
    changed.to_csv(tmp_path / "b.csv", index=False)
    plan = ReplayPlan(START + 8 * DAY, START + 10 * DAY, every, DAY)
    run_settings = TrainingSettings.model_validate({"live_line": {"training_days": 6}})
    a, _ = run_replay(tmp_path / "a.csv", plan, run_settings)
    b, _ = run_replay(tmp_path / "b.csv", plan, run_settings)
    assert list(a.columns) == ["namespace", "workload", "container", "resource", "issued_at", "step", "value"]
    assert set(a["resource"]) == {"cpu", "memory"}
    assert ((a["step"] >= a["issued_at"]) & (a["step"] < a["issued_at"] + every)).all()
    assert ((a["issued_at"] - plan.start) % every == 0).all() and (a["step"] % 300 == 0).all()
    assert len(a) == 12 * 2 * (2 * DAY // 300)  # every container, resource and step, each under one issue
    assert not a.duplicated(["workload", "container", "resource", "step"]).any()
    before = a["issued_at"] < cut
    pd.testing.assert_frame_equal(a[before].reset_index(drop=True), b[b["issued_at"] < cut].reset_index(drop=True))
    assert not np.allclose(a[~before]["value"], b[b["issued_at"] >= cut]["value"])


def test_replay_fits_its_model_for_the_block_each_line_is_held(tmp_path: Path) -> None:
    """`--every 1h` holds each line for an hour, so its model is the hour's whatever block the settings give the live
    loop's model; `--every 5m` holds each for a step, and the next step's model (the default) issues other lines."""
    tidy(bursty_grid(rows=12, days=10)).to_csv(tmp_path / "a.csv", index=False)
    hourly = ReplayPlan(START + 8 * DAY, START + 9 * DAY, 3600, DAY)
    fitted = {
        horizon: run_replay(
            tmp_path / "a.csv",
            hourly,
            TrainingSettings.model_validate({"live_line": {"training_days": 6, "horizon_seconds": horizon}}),
        )[0]
        for horizon in (300, 3600)
    }
    pd.testing.assert_frame_equal(fitted[300], fitted[3600])
    assert TrainingSettings().live_line.horizon_seconds == 300
    every_step = ReplayPlan(START + 8 * DAY, START + 9 * DAY, 300, DAY)
    stepwise, _ = run_replay(
        tmp_path / "a.csv", every_step, TrainingSettings.model_validate({"live_line": {"training_days": 6}})
    )
    first_hour = fitted[300]["issued_at"] == hourly.start
    first_step = stepwise["issued_at"] == hourly.start
    assert not np.allclose(fitted[300][first_hour]["value"].to_numpy()[::12], stepwise[first_step]["value"])


@settings(max_examples=30, deadline=None)
@given(
    newest=arrays(np.float64, 12, elements=st.floats(0, 1e3) | st.just(np.nan)),
    factor=st.floats(0.1, 10),
)
def test_an_issued_line_is_never_below_the_step_just_seen(newest: np.ndarray, factor: float) -> None:
    """`issue` serves the calibrated line, at least the grid's newest step where it has a sample (a container with
    no line keeps none); the node line's model, whose room keeps the newest usage itself, has no floor."""
    grid = bursty_grid(rows=12, days=10)
    grid[:, -1] = newest
    model = LiveLineForecaster(training_days=6, floor_at_last_step=True).fit(grid[:, :-1], grid_end=START)
    factors = np.full(12, factor)
    raw = model.predict(grid, issued_at=START) * factors
    issued = model.issue(grid, START, factors)
    served = ~np.isnan(raw)
    assert np.array_equal(np.isnan(issued), ~served)
    seen = served & ~np.isnan(newest)
    assert np.all(issued[seen] >= newest[seen]) and np.all(issued[served] >= raw[served])
    assert np.array_equal(issued[served & np.isnan(newest)], raw[served & np.isnan(newest)])
    assert np.array_equal(model.set_params(floor_at_last_step=False).issue(grid, START, factors), raw, equal_nan=True)
    assert node_live_line(LiveLineSettings(), ColocationSettings(), 300).floor_at_last_step is False
    assert LiveLineForecaster.from_settings(LiveLineSettings(), 0.01).floor_at_last_step is True


@pytest.mark.parametrize("level", [0.01, 0.05])
def test_the_calibration_moves_as_fast_an_hour_whatever_block_a_line_covers(level: float) -> None:
    """A line for the next step, calibrated after each of an hour's twelve steps, moves the fleet's factor (and a
    container's, at one rate up and down) as far as a line for the hour calibrated once after it: the rates are per
    hour of samples, so the cadence does not change how fast the level is restored."""
    rng = np.random.default_rng(3)
    observed = rng.gamma(2.0, 0.5, (4, 12))
    lines = np.full(4, 1.5)
    hour, step = (
        LiveLineForecaster(target_violation=level, horizon_seconds=horizon, own_sink_rate=0.02).initial_scale()
        for horizon in (3600, 300)
    )
    assert hour.steps_per_hour == step.steps_per_hour == 12
    hour = hour.updated(lines, observed)
    for column in range(12):
        step = step.updated(lines, observed[:, [column]])
    assert step.fleet == pytest.approx(hour.fleet) and hour.fleet != 0.0
    assert step.own == pytest.approx(hour.own) and np.ptp(hour.own) > 0


def test_replay_calibrates_replicated_workloads_on_every_pod_s_samples(tmp_path: Path) -> None:
    """Workloads of four pods with independent noise, replayed at 5 %: the share of the pods' own samples above their
    line (what the harness counts) comes to the asked level, not the far smaller share a calibration on each step's
    busiest pod would leave."""
    rng = np.random.default_rng(4)
    base = bursty_grid(rows=30, days=12, seed=5)
    frames = []
    for pod in range(4):
        usage = tidy(base * rng.gamma(8.0, 1 / 8.0, base.shape))
        frames.append(usage.assign(pod=usage["workload"].astype(str) + f"-{pod}"))
    data = pd.concat(frames, ignore_index=True).sort_values(["namespace", "workload", "pod", "container", "timestamp"])
    data.to_csv(tmp_path / "pods.csv", index=False)
    plan = ReplayPlan(START + 8 * DAY, START + 12 * DAY, 3600, 2 * DAY)
    # The fleet's factor at 0.01 (0.2 x 5 %, the default before 2026-12-07) reaches the level within the two days
    # replayed here.
    live = {"training_days": 6, "fleet_adaptation_rate": 0.01}
    at_5 = {"live_line": live, "forecast": {"short_term_target_violation": 0.05}}
    lines, _ = run_replay(tmp_path / "pods.csv", plan, TrainingSettings.model_validate(at_5))
    lines = lines[lines["resource"] == "cpu"]
    scored = data.assign(step=data["timestamp"] // 300 * 300).merge(lines, on=["workload", "step"])
    scored = scored[scored["issued_at"] >= START + 10 * DAY]  # after two days of calibration
    per_pod = float(np.mean(scored["cpu_cores"] > scored["value"]))
    busiest = scored.groupby(["workload", "step"]).agg(usage=("cpu_cores", "max"), line=("value", "first"))
    assert abs(per_pod - 0.05) <= 0.01, per_pod
    assert float(np.mean(busiest["usage"] > busiest["line"])) > 0.08


@pytest.mark.parametrize(
    ("start", "end", "every", "message"),
    [
        (START + 1, START + DAY, 3600, "5-minute grid"),
        (START, START + DAY, 100, "multiple of 5 minutes"),
        (START, START, 3600, "not after --start"),
        (START, START + 10_000 * DAY, 300, "issue times"),
    ],
)
def test_replay_plans_that_make_no_sense_are_refused(start: int, end: int, every: int, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ReplayPlan(start, end, every, max(every, DAY))


def test_train_fits_the_live_line_and_live_updates_issue_and_calibrate_it() -> None:
    """`fit` (train) fits the learned line and issues it; the recommendation says so and its short-term line's first
    step (the block the line covers, the next 5 minutes) is that value; `live_update` (the live loop) learns from the
    steps since, and issues the next line."""
    from models.settings import ModelSettings
    from models.workload import WorkloadRecommender
    from tests.conftest import make_usage

    usage = make_usage(workloads=3, pods=1, days=5)
    end = int(usage["timestamp"].max())
    model = WorkloadRecommender.from_settings(ModelSettings()).fit(usage[usage["timestamp"] < end - 3600])
    first = model.predict()
    for rec in first.recommendations:
        live = rec.cpu.live_short_term
        assert live is not None and live.until - live.issued_at == 300
        assert rec.cpu.short_term[0] == live.value
        assert rec.cpu.peak.value >= live.value
    before = model.cpu_live_issued_
    later = usage[usage["timestamp"] >= end - 3600].assign(cpu_cores=lambda f: f["cpu_cores"] * 5)
    model.live_update(later)
    assert model.cpu_live_issued_.at > before.at
    assert model.cpu_live_scale_.fleet > 0  # every sample of the hour ran above the line: it rises
    second = model.predict()
    assert all(r.cpu.live_short_term is not None for r in second.recommendations)
    assert second.recommendations[0].cpu.live_short_term.calibration_factor > 1


def test_a_new_version_continues_the_live_calibration_container_by_container() -> None:
    """The next version (a fresh fit, factor 1) takes each container's whole log-factor from the version the live
    loop continued, and issues its first line with it; a container the old version did not have starts at their
    mean (the fleet's); a new risk level starts afresh."""
    from models.settings import ModelSettings
    from models.workload import WorkloadRecommender, continue_calibration
    from recommender.settings import ForecastSettings
    from tests.conftest import make_usage

    usage = make_usage(workloads=4, pods=1, days=5)
    end = int(usage["timestamp"].max())
    hourly = ModelSettings(live_line=LiveLineSettings(horizon_seconds=3600))
    old = WorkloadRecommender.from_settings(hourly)
    old.fit(usage[(usage["timestamp"] < end - 7200) & (usage["workload"] != "w3")])
    hour = usage[(usage["timestamp"] >= end - 7200) & (usage["timestamp"] < end - 3600) & (usage["workload"] != "w3")]
    old.live_update(hour.assign(cpu_cores=np.where(hour["workload"] == "w0", hour["cpu_cores"] * 5, hour["cpu_cores"])))
    scale = old.cpu_live_scale_
    logs = dict(zip(old.forecast_groups_.tolist(), np.log(scale.factors(old.forecast_groups_.size)).tolist()))
    assert scale.own is not None and np.ptp(scale.own) > 0  # w0 rose against the others

    new = WorkloadRecommender.from_settings(hourly).fit(usage[usage["timestamp"] < end - 3600])
    assert np.allclose(new.cpu_live_scale_.factors(new.forecast_groups_.size), 1.0)
    fresh_lines = new.cpu_live_issued_.lines.copy()
    continue_calibration([old], [new])
    groups = new.forecast_groups_.tolist()
    carried = np.log(new.cpu_live_scale_.factors(len(groups)))
    for group, value in zip(groups, carried.tolist()):
        expected = logs.get(group, float(np.mean(list(logs.values()))))
        assert value == pytest.approx(expected), group
    issued = new.cpu_live_issued_
    assert issued.at == new.grid_end_
    assert np.allclose(issued.lines, fresh_lines * np.exp(carried))
    assert np.allclose(issued.factors, np.exp(carried))

    other = hourly.model_copy(update={"forecast": ForecastSettings(short_term_target_violation=0.05)})
    at_5 = WorkloadRecommender.from_settings(other).fit(usage[usage["timestamp"] < end - 3600])
    continue_calibration([old], [at_5])
    assert np.allclose(at_5.cpu_live_scale_.factors(at_5.forecast_groups_.size), 1.0)


def test_live_updates_calibrate_replicated_workloads_on_every_pod_s_samples() -> None:
    """A live pass where one pod of four in each workload runs far above the line (an hour's line, so the pass's hour
    is its block): a quarter of the pods' samples miss, so the fleet's factor rises by about the rate x (1/4 - P),
    not by the rate x (1 - P) of a calibration on each step's busiest pod."""
    from models.settings import ModelSettings
    from models.workload import WorkloadRecommender
    from tests.conftest import make_usage

    usage = make_usage(workloads=3, pods=4, days=5)
    end = int(usage["timestamp"].max())
    hourly = ModelSettings(live_line=LiveLineSettings(horizon_seconds=3600))
    model = WorkloadRecommender.from_settings(hourly).fit(usage[usage["timestamp"] < end - 3600])
    later = usage[usage["timestamp"] >= end - 3600].copy()
    hot = later["pod"].str.endswith("-p0")
    later.loc[hot, "cpu_cores"] *= 5
    model.live_update(later)
    scale = model.cpu_live_scale_
    level, rate = scale.target_violation, scale.fleet_rate
    assert rate * (0.25 / level - 1) * 0.8 <= scale.fleet <= rate * ((0.25 + 0.1) / level - 1)


@pytest.mark.parametrize("pods", [1, 2])
def test_a_pass_after_a_gap_calibrates_the_line_on_the_steps_it_covered(pods: int) -> None:
    """The next step's line, and a pass that brings an hour: only the hour's first step was under that line (the
    day-ahead line served the rest), so the calibration counts it alone; a burst in the hour's last step moves
    nothing, one in its first step does."""
    from models.settings import ModelSettings
    from models.workload import WorkloadRecommender
    from tests.conftest import make_usage

    usage = make_usage(workloads=3, pods=pods, days=5)
    end = int(usage["timestamp"].max())
    fleets = []
    for burst in (0, 11):
        model = WorkloadRecommender.from_settings(ModelSettings()).fit(usage[usage["timestamp"] < end - 3600])
        hour = usage[usage["timestamp"] >= end - 3600].copy()
        step = (hour["timestamp"] - (end - 3600)) // 300
        hour.loc[step == burst, "cpu_cores"] *= 50
        model.live_update(hour)
        fleets.append(model.cpu_live_scale_.fleet)
    assert fleets[0] > 0 > fleets[1]


def test_a_workload_with_a_risk_level_of_its_own_keeps_the_day_ahead_line() -> None:
    from models.settings import ModelSettings
    from models.workload import WorkloadRecommender
    from recommender.settings import ForecastSettings
    from tests.conftest import make_usage

    settings = ModelSettings(forecast=ForecastSettings(target_violation_overrides={"ns/w0": 0.05}))
    recs = WorkloadRecommender.from_settings(settings).fit(make_usage(workloads=3, pods=1, days=5)).predict()
    served = {r.workload: r.cpu.live_short_term is not None for r in recs.recommendations}
    assert served == {"w0": False, "w1": True, "w2": True}
