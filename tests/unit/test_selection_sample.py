"""A big fleet's forecast choice made on a sample of its containers (`ForecastSettings.selection_max_containers`):
the sample is the same whatever the partitions, the decision is the one the sample alone gives, and every other
container is fitted with its burstiness group's choice."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from models.ensemble import FutureUsage, burstiness, rolling_origins, selection_rows
from models.forecast import STEPS_PER_DAY
from models.workload import FleetForecaster, fit_resource_forecasts
from recommender.arrays import FloatArray
from recommender.settings import ForecastSettings

END = 1_700_000_000


@given(
    keys=st.lists(st.integers(0, 2**64 - 1), unique=True, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=4),
    most=st.integers(0, 70),
    seed=st.integers(0, 2**16),
)
def test_the_sample_is_the_smallest_keys_of_the_eligible_rows_whatever_the_partitions(
    keys: list[int], cuts: list[int], most: int, seed: int
) -> None:
    fleet = np.array(keys, dtype=np.uint64)
    bounds = sorted({0, fleet.size, *(min(c, fleet.size) for c in cuts)})
    parts = [fleet[a:b] for a, b in itertools.pairwise(bounds)] or [fleet]
    rng = np.random.default_rng(seed)
    rows = [np.flatnonzero(rng.random(part.size) < 0.8) for part in parts]  # some rows lack a day of samples
    chosen = selection_rows(rows, parts, most)
    eligible = np.sort(np.concatenate([p[r] for p, r in zip(parts, rows)]))
    picked = np.sort(np.concatenate([p[c] for p, c in zip(parts, chosen)]))
    assert all(np.isin(c, r).all() for c, r in zip(chosen, rows))
    if most == 0 or eligible.size <= most:
        assert all(np.array_equal(c, r) for c, r in zip(chosen, rows))
    else:
        np.testing.assert_array_equal(picked, eligible[:most])


def three_kinds(containers: int = 45, days: int = 10, seed: int = 0) -> FloatArray:
    """A usage grid of steady, daily-cycling and bursty containers (a third each, far apart in burstiness), and two
    containers with less than a day of samples."""
    rng = np.random.default_rng(seed)
    steps = days * STEPS_PER_DAY
    t = np.arange(steps)
    grid = np.empty((containers, steps))
    for i in range(containers):
        base = 1.0 + rng.random()
        kind = i % 3
        if kind == 0:
            grid[i] = base * (1 + 0.02 * rng.standard_normal(steps))
        elif kind == 1:
            grid[i] = base * (1.5 + np.sin(2 * np.pi * t / STEPS_PER_DAY)) * (1 + 0.05 * rng.standard_normal(steps))
        else:
            grid[i] = base * (0.05 + 20.0 * (rng.random(steps) < 0.02))
    grid[-2:, : steps - STEPS_PER_DAY // 2] = np.nan
    return grid


def test_the_choice_on_a_sample_is_the_samples_own_and_the_others_take_their_groups() -> None:
    grid = three_kinds()
    keys = [pd.util.hash_array(np.arange(grid.shape[0], dtype=np.int64))]
    # A sample of 20 is a fleet that chooses (below `selection_min_containers` nothing would be chosen or pooled).
    settings = ForecastSettings(group_min_containers=3, selection_max_containers=20, selection_min_containers=10)
    sampled = fit_resource_forecasts([grid], settings, END, keys)[0]
    rows = np.flatnonzero(np.sum(~np.isnan(grid), axis=1) >= STEPS_PER_DAY)
    decided = selection_rows([rows], keys, 20)[0]
    others = np.setdiff1d(rows, decided)
    assert decided.size == 20 and others.size == rows.size - 20
    alone = fit_resource_forecasts([grid[decided]], settings, END)[0]
    for line in ("short_term", "request", "long_term"):
        a, b = getattr(sampled, line), getattr(alone, line)
        assert a.fleet_factor_ == b.fleet_factor_
        np.testing.assert_array_equal(a.choice_[decided], b.choice_)
        np.testing.assert_array_equal(a.groups_[decided], b.groups_)
        group_choice = dict(zip(b.groups_.tolist(), b.choice_.tolist()))
        assert [group_choice[g] for g in a.groups_[others]] == a.choice_[others].tolist()
        # No own calibration for the others: their group's factor (the fleet's, with the default priors).
        assert (a.calibration_samples_[others] == 0).all() and (a.calibration_samples_[decided] > 0).all()
        np.testing.assert_array_equal(a.factors_[others], np.clip(a.group_factors_[a.groups_[others]], 0.25, 4.0))
        assert np.isfinite(a.predict(STEPS_PER_DAY)[rows]).all()
    # The others are grouped by the sample's bounds: the groups rise with burstiness over every container.
    origins = rolling_origins(grid.shape[1], settings.selection_days, STEPS_PER_DAY)
    ratio = burstiness(FutureUsage(grid, origins, STEPS_PER_DAY, rows=rows))
    groups = sampled.short_term.groups_[rows]
    assert (np.diff(groups[np.argsort(ratio, kind="stable")]) >= 0).all()
    assert set(groups[np.isin(rows, others)].tolist()) == {0, 1, 2}


def test_containers_gone_before_the_selection_days_are_not_chosen_on() -> None:
    """A container whose samples end before the first origin (a finished job, a workload scaled away) has nothing to
    score a line against: the choice is the live containers' alone, and it takes its group's choice and factor."""
    live = three_kinds(containers=30, days=12)
    gone = three_kinds(containers=30, days=12, seed=1)
    gone[:, -8 * STEPS_PER_DAY :] = np.nan
    grid = np.concatenate([live, gone])
    settings = ForecastSettings(group_min_containers=3)
    both = fit_resource_forecasts([grid], settings, END)[0]
    alone = fit_resource_forecasts([live], settings, END)[0]
    dead = np.arange(live.shape[0], grid.shape[0])
    for line in ("short_term", "request", "long_term"):
        a, b = getattr(both, line), getattr(alone, line)
        assert a.fleet_factor_ == b.fleet_factor_
        np.testing.assert_array_equal(a.choice_[: live.shape[0]], b.choice_)
        np.testing.assert_array_equal(a.groups_[: live.shape[0]], b.groups_)
        np.testing.assert_array_equal(a.predict(STEPS_PER_DAY)[: live.shape[0]], b.predict(STEPS_PER_DAY))
        group_choice = dict(zip(b.groups_.tolist(), b.choice_.tolist()))
        assert all(group_choice.get(g, c) == c for g, c in zip(a.groups_[dead].tolist(), a.choice_[dead].tolist()))
        assert (a.calibration_samples_[dead] == 0).all()
    # A partition of gone containers only is fitted as the fleet in one piece fits them.
    parts = fit_resource_forecasts([live, gone], settings, END)
    for line in ("short_term", "request", "long_term"):
        np.testing.assert_array_equal(
            np.concatenate([getattr(p, line).predict(STEPS_PER_DAY) for p in parts]),
            getattr(both, line).predict(STEPS_PER_DAY),
        )


def test_a_fleet_no_bigger_than_the_sample_is_decided_on_every_container() -> None:
    grid = three_kinds(containers=12)
    keys = [pd.util.hash_array(np.arange(grid.shape[0], dtype=np.int64))]
    settings = ForecastSettings(group_min_containers=3)
    every = fit_resource_forecasts([grid], settings, END, keys)[0]
    capped = fit_resource_forecasts([grid], settings.model_copy(update={"selection_max_containers": 12}), END, keys)[0]
    for line in ("short_term", "request", "long_term"):
        np.testing.assert_array_equal(getattr(every, line).predict(STEPS_PER_DAY), getattr(capped, line).predict(288))


def test_a_forecaster_pickled_before_the_setting_decides_on_every_container() -> None:
    state = FleetForecaster().__getstate__()
    del state["selection_max_containers"]
    loaded = FleetForecaster.__new__(FleetForecaster)
    loaded.__setstate__(state)
    assert loaded.get_params()["selection_max_containers"] == 0
    assert loaded.settings().selection_max_containers == 0
