"""The fit's shared work (issue 17): candidates fitted together give what each fits alone, the windowed quantile from
each column's largest values is the sorted one, and the usage after each origin read from a padded grid is
`usage_after`'s, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.base import clone

from models.ensemble import (
    FutureUsage,
    constant_candidates,
    short_term_candidates,
    usage_after,
    usage_rows,
)
from models.forecast import (
    DecayedQuantileForecaster,
    FlatQuantileForecaster,
    MultiWindowQuantileForecaster,
    WindowQuantileForecaster,
    fit_together,
    nan_quantiles,
    window_quantile,
)
from recommender.settings import ForecastSettings

#: Usage-like values: ties (small integers), zeros, gaps.
cells = st.one_of(st.sampled_from([0.0, 1.0, 2.0, 3.0, np.nan]), st.floats(0, 1e3, allow_subnormal=False))


def sorted_quantiles(values: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """The "higher" quantile by a full sort (NaN last), as `nan_quantiles` defines it."""
    count = np.sum(~np.isnan(values), axis=-1)
    ordered = np.sort(values, axis=-1)
    out = []
    for q in qs:
        rank = np.clip(np.ceil(q * count).astype(np.int64) - 1, 0, max(values.shape[-1] - 1, 0))
        picked = np.take_along_axis(ordered, rank[..., None], axis=-1)[..., 0]
        out.append(np.where(count > 0, picked, np.nan))
    return out


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 12)), elements=cells),
    st.integers(1, 5),
    st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999, 1.0]),
)
def test_window_quantile_is_the_sorted_quantile_of_the_union(segments: np.ndarray, width: int, q: float) -> None:
    width = min(width, segments.shape[2])
    rows, days, _ = segments.shape
    union = np.moveaxis(sliding_window_view(segments, width, axis=2), 1, 2).reshape(rows, -1, days * width)
    np.testing.assert_array_equal(window_quantile(segments, width, q), sorted_quantiles(union, (q,))[0])


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 150)), elements=cells),
    st.lists(st.sampled_from([0.0, 0.5, 0.98, 0.99, 0.995, 1.0]), min_size=1, max_size=3),
)
def test_nan_quantiles_by_maxima_or_sort_are_the_sorted_ones(values: np.ndarray, qs: list[float]) -> None:
    values[0, : values.shape[1] // 2] = np.nan  # some rows empty or nearly, even with all-known draws
    if values.shape[0] > 1:
        values[1] = np.nan
    for got, want in zip(nan_quantiles(values, tuple(qs)), sorted_quantiles(values, tuple(qs))):
        np.testing.assert_array_equal(got, want)


@pytest.fixture(scope="module")
def grid() -> np.ndarray:
    """Three weeks of 5-minute usage of 40 containers: daily rhythm, bursts, ties, gaps and late starters."""
    rng = np.random.default_rng(17)
    steps = np.arange(21 * 288)
    usage = 1.0 + np.sin(2 * np.pi * steps / 288)[None, :] + rng.gamma(1.5, 0.4, size=(40, steps.size))
    usage[:10] = np.round(usage[:10])
    usage[rng.random(usage.shape) < 0.05] = np.nan
    usage[30:, : 10 * 288] = np.nan
    usage[35:] = np.nan
    return usage


def test_candidates_fitted_together_are_those_fitted_alone(grid: np.ndarray) -> None:
    forecast = ForecastSettings()
    candidates = [
        *short_term_candidates(forecast, 0.01),
        *constant_candidates(forecast, 0.05),
        WindowQuantileForecaster(days=3, window_steps=0, quantile=0.9),
        DecayedQuantileForecaster(days=2.5, quantile=0.5, half_life_steps=7),
        MultiWindowQuantileForecaster(days=30.0, windows=5, quantile=0.999),
        FlatQuantileForecaster(days=40.0, quantile=1.0),
    ]
    for end in (288, 10 * 288 + 17, grid.shape[1]):
        together = fit_together(candidates, grid[:, :end])
        for candidate, model in zip(candidates, together):
            alone = clone(candidate).fit(grid[:, :end])
            np.testing.assert_array_equal(model.predict(300), alone.predict(300), err_msg=repr(candidate))


@pytest.mark.parametrize("steps", [1, 288, 7 * 288])
def test_usage_after_read_from_picked_rows_of_a_grid_is_usage_after(grid: np.ndarray, steps: int) -> None:
    """A partition's scored rows are read from its grid as it is: the same usage, C-ordered, as cut from a copy."""
    origins = [grid.shape[1] - day * 288 for day in range(7, 0, -1)]
    picked = np.arange(0, grid.shape[0], 2)
    plain, rows_of = FutureUsage(grid, origins, steps), FutureUsage(grid, origins, steps, rows=picked)
    for rows in (slice(0, 20), slice(3, 17), slice(19, 20)):
        np.testing.assert_array_equal(plain.rows(rows), usage_after(grid[rows], origins, steps))
        want = usage_after(grid[picked[rows]], origins, steps)
        np.testing.assert_array_equal(rows_of.rows(rows), want)
        assert usage_rows(rows_of, rows, ordered=True).flags.c_contiguous
