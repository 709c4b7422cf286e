"""The forecast fit's fast paths (issue 17) equal the straightforward computations they replace: constant lines scored
from sorted chunks of the usage (matched costs, pinball costs, pooled calibration quantiles), the calibration sketch
counted over its bins, the backtest's decayed quantiles read from one sort of the grid, and the time-of-day windows'
largest values slid over the columns. Ties, gaps (NaN),
containers without samples, zero and unknown levels are all drawn."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.base import clone

from models import ensemble, forecast
from models.ensemble import (
    FleetUsage,
    FutureUsage,
    SortedSegments,
    _higher_quantile,
    blocked_line_costs,
    constant_line_costs,
    labelled_quantiles,
    ratio_blocks,
    ratio_sketch,
    selection_costs,
    usage_after,
)
from models.forecast import (
    DecayedQuantileForecaster,
    FlatQuantileForecaster,
    GridOrder,
    MultiWindowQuantileForecaster,
    _sliding_tops,
    _tops,
    fit_together,
)
from recommender.arrays import FloatArray, IntArray

P = 24  # steps per "day": small, so that many cases run in seconds


def drawn_grid(seed: int, containers: int, days: int, missing: float, ties: bool) -> FloatArray:
    """Usage with gaps, an idle container, one without samples and, with `ties`, values on a coarse grid."""
    rng = np.random.default_rng(seed)
    grid = rng.gamma(2.0, 1.0, size=(containers, days * P)) * rng.uniform(0.1, 3, size=(containers, 1))
    if ties:
        grid = np.round(grid, 0)
    grid[rng.random(grid.shape) < missing] = np.nan
    if containers > 2:
        grid[1] = 0.0
        grid[2] = np.nan
    return grid


def drawn_levels(seed: int, shape: tuple[int, int], usage: FloatArray, ties: bool) -> FloatArray:
    """Constant lines near the usage's level, with a zero and an unknown level, on the usage's grid with `ties`."""
    rng = np.random.default_rng(seed + 1)
    base = np.nan_to_num(np.fmax.reduce(usage, axis=2), nan=1.0)
    levels: FloatArray = base * rng.uniform(0.3, 1.1, size=shape)
    if ties:
        levels = np.round(levels, 0)
    levels[rng.random(shape) < 0.1] = np.nan
    levels[rng.random(shape) < 0.05] = 0.0
    return levels


def usages(grid: FloatArray, origins: list[int], steps: int) -> list[FloatArray | FutureUsage | FleetUsage]:
    """The same past usage materialised, read from the grid in chunks, as a fleet of two partitions, and as rows
    picked from grids with other rows between them."""
    room = grid
    cut = grid.shape[0] // 2
    spread = np.full((2 * grid.shape[0], grid.shape[1]), 7.0)
    spread[1::2] = grid
    odd = np.arange(1, spread.shape[0], 2)
    return [
        usage_after(grid, origins, steps),
        FutureUsage(room, origins, steps),
        FleetUsage([FutureUsage(room[:cut], origins, steps), FutureUsage(room[cut:], origins, steps)]),
        FleetUsage(
            [FutureUsage(spread, origins, steps, rows=odd[:cut]), FutureUsage(spread, origins, steps, rows=odd[cut:])]
        ),
    ]


@dataclass
class Case:
    """A drawn grid, its origins and steps after each, a constant line's levels and the level q of the quantile."""

    grid: FloatArray
    origins: list[int]
    steps: int
    levels: FloatArray
    q: float
    seed: int

    def usage(self) -> FloatArray:
        return usage_after(self.grid, self.origins, self.steps)


def drawn_case(seed: int, containers: int, n_origins: int, days: int, missing: float, ties: bool, q: float) -> Case:
    grid = drawn_grid(seed, containers, n_origins + days + 1, missing, ties)
    origins = [(1 + i) * P for i in range(n_origins)]
    levels = drawn_levels(seed, (n_origins, containers), usage_after(grid, origins, days * P), ties)
    return Case(grid, origins, days * P, levels, q, seed)


cases = st.builds(
    drawn_case,
    st.integers(0, 2**31),  # seed
    st.integers(1, 12),  # containers
    st.integers(1, 4),  # origins
    st.sampled_from([1, 3]),  # days after each origin
    st.floats(0.0, 0.6),  # missing share
    st.booleans(),  # ties
    st.sampled_from([0.5, 0.9, 0.99, 1.0]),  # q
)


@pytest.mark.parametrize("n_labels", [1, 3])  # one label: the union's tail is that label's, read once
@settings(max_examples=60, deadline=None)
@given(cases)
def test_constant_line_costs_equal_those_of_every_ratio(n_labels: int, case: Case) -> None:
    labels: IntArray = np.random.default_rng(case.seed).integers(-1, n_labels, size=(case.grid.shape[0],))
    for usage in usages(case.grid, case.origins, case.steps):
        fast = constant_line_costs(SortedSegments(usage), case.levels, labels, n_labels, case.q)
        slow = blocked_line_costs(case.levels[:, :, None], usage, labels, n_labels, case.q)
        np.testing.assert_array_equal(fast[0], slow[0])  # the quantiles: the same order statistics
        np.testing.assert_array_equal(fast[1], slow[1])  # their counts
        labelled = labels >= 0  # (`labelled_costs` reads the counts of labelled containers only)
        np.testing.assert_array_equal(fast[2][:, labelled], slow[2][:, labelled])  # samples above them
        np.testing.assert_allclose(fast[3], slow[3], rtol=1e-12)  # n x level, summed in another order


@settings(max_examples=40, deadline=None)
@given(cases)
def test_a_tail_read_a_block_at_a_time_gives_the_quantile_and_counts_read_at_once(case: Case) -> None:
    """Equal ratios far more than the quantile's rank above the bound (flat usage) are read in blocks of bins."""
    labels: IntArray = np.random.default_rng(case.seed).integers(-1, 3, size=(case.grid.shape[0],))
    segments = SortedSegments(usage_after(case.grid, case.origins, case.steps))
    whole = constant_line_costs(segments, case.levels, labels, 3, case.q)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ensemble, "TAIL_BLOCK_VALUES", 5)
        blocked = constant_line_costs(segments, case.levels, labels, 3, case.q)
    for a, b in zip(whole, blocked):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(cases)
def test_the_tail_quantile_of_each_label_is_the_higher_quantile_of_its_ratios(case: Case) -> None:
    labels: IntArray = np.random.default_rng(case.seed).integers(-1, 2, size=(case.grid.shape[0],))
    ratios = ensemble.scored_ratios(case.levels[:, :, None], case.usage())
    segments = SortedSegments(FutureUsage(case.grid, case.origins, case.steps))
    for label, (quantile, count, _, _) in enumerate(segments.labelled_tails(case.levels, labels, 2, case.q)):
        members = labels >= 0 if label == 2 else labels == label
        known = ratios[:, members][~np.isnan(ratios[:, members])]
        assert count == known.size
        assert quantile == _higher_quantile(known, case.q) if known.size else np.isnan(quantile)


@settings(max_examples=40, deadline=None)
@given(cases)
def test_constant_pinball_costs_equal_the_sum_over_samples(case: Case) -> None:
    direct, q = case.usage(), case.q
    line = np.broadcast_to(case.levels[:, :, None], direct.shape)
    known = ~np.isnan(direct) & ~np.isnan(line)
    over = np.where(known, np.maximum(direct - line, 0.0), 0.0)
    under = np.where(known, np.maximum(line - direct, 0.0), 0.0)
    scale = np.maximum(np.nansum(direct, axis=(0, 2)), 1e-12)
    expected = np.where(known.any(axis=(0, 2)), (q * over + (1 - q) * under).sum(axis=(0, 2)) / scale, np.nan)
    for usage in usages(case.grid, case.origins, case.steps):
        got = selection_costs([case.levels[:, :, None]], usage, 1.0 - q)[0]
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def reference_sketch(ratios: FloatArray) -> tuple[IntArray, IntArray]:
    """The sketch as a sort of every known ratio's bin gives it."""
    values = ratios[~np.isnan(ratios)]
    positive = np.isfinite(values) & (values > 0)
    bins = np.floor(np.log(np.where(positive, values, 1.0)) / ensemble._LOG_STEP).astype(np.int64)
    codes = np.where(positive, bins, np.where(np.isinf(values), ensemble._INF_BIN, ensemble._ZERO_BIN))
    unique, counts = np.unique(codes, return_counts=True)
    return unique.astype(np.int64), counts.astype(np.int64)


sketched = st.lists(
    st.one_of(
        st.floats(0, 1e300, allow_subnormal=True),
        st.sampled_from([0.0, -0.0, -1.0, float("inf"), float("-inf"), float("nan"), 1.0, 1.0 + 1e-12]),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(sketched, st.sampled_from([0, 1 << 20]))
def test_the_counted_sketch_equals_the_sorted_one(values: list[float], counted: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ensemble, "SKETCH_COUNTED_BINS", counted)  # 0: every sketch by sort
        got = ratio_sketch(np.asarray(values, dtype=np.float64))
    expected = reference_sketch(np.asarray(values, dtype=np.float64))
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert got[0].dtype == np.int64 and got[1].dtype == np.int64


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 9), st.floats(0.0, 0.5), st.booleans())
def test_decayed_quantiles_from_one_sort_of_the_grid_equal_a_sort_per_window(
    seed: int, containers: int, missing: float, ties: bool
) -> None:
    grid = drawn_grid(seed, containers, 6, missing, ties)
    candidates = [
        DecayedQuantileForecaster(days=d, quantile=q, half_life_steps=h, steps_per_day=P)
        for d, q, h in ((2.0, 0.9, 12), (5.0, 0.99, 24), (8.0, 0.5, 6))
    ]
    order = GridOrder(grid)
    for origin in (P, 3 * P, 6 * P):
        shared = fit_together(candidates, grid[:, :origin], order)
        alone = [c.fit(grid[:, :origin]) for c in candidates]
        for a, b in zip(shared, alone):
            np.testing.assert_array_equal(a.level_, b.level_)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 9), st.floats(0.0, 0.5), st.booleans(), st.sampled_from([1, 3, 256]))
def test_flat_and_decayed_quantiles_from_the_grids_top_values_equal_a_sort_per_window(
    seed: int, containers: int, missing: float, ties: bool, top_values: int
) -> None:
    """Read from the grid's largest values where they settle the rank (few kept: most rows take their window's sort)."""
    grid = drawn_grid(seed, containers, 6, missing, ties)
    candidates = [
        FlatQuantileForecaster(days=d, quantile=q, steps_per_day=P) for d, q in ((1.0, 0.9), (2.5, 0.99), (6.0, 1.0))
    ] + [
        MultiWindowQuantileForecaster(days=5.0, shortest_days=1.0, windows=3, quantile=0.95, steps_per_day=P),
        DecayedQuantileForecaster(days=5.0, quantile=0.9, half_life_steps=12, steps_per_day=P),
        DecayedQuantileForecaster(days=2.0, quantile=0.99, half_life_steps=48, steps_per_day=P),
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(forecast, "TOP_VALUES", top_values)
        order = GridOrder(grid)
        for origin in (P, 3 * P, 6 * P):
            shared = fit_together(candidates, grid[:, :origin], order)
            for model, candidate in zip(shared, candidates):
                np.testing.assert_array_equal(model.level_, clone(candidate).fit(grid[:, :origin]).level_)


def test_labelled_quantiles_of_sorted_chunks_equal_the_blocked_ones_on_a_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration's pooled quantiles: sorted chunks (default) and ratio blocks (a tail too large for a block)."""
    grid = drawn_grid(5, 40, 12, 0.1, True)
    origins = [4 * P, 5 * P, 6 * P, 7 * P]
    usage = FleetUsage([FutureUsage(grid[:25], origins, 7 * P), usage_after(grid[25:], origins, 7 * P)])
    levels = drawn_levels(5, (4, 40), usage_after(grid, origins, 7 * P), True)
    labels = np.random.default_rng(5).integers(-1, 3, size=40)
    fast = [t[:2] for t in SortedSegments(usage).labelled_tails(levels, labels, 3, 0.97)]
    monkeypatch.setattr(ensemble, "SELECTION_BLOCK_VALUES", 600)  # a container a block
    assert not ensemble.sorted_scoring(levels[:, :, None], usage, 0.97)
    slow = labelled_quantiles(ratio_blocks(levels[:, :, None], usage), labels, 3, 0.97)
    assert [q for q, _ in fast] == slow[0].tolist() and [n for _, n in fast] == slow[1].tolist()


def test_a_decayed_quantile_at_a_step_of_the_cumulative_weights_is_sorted_on_its_own() -> None:
    """Where the quantile's weight is a step of the cumulative weights, the order of equal values could move the
    rank by rounding: such a row is flagged and fitted from its own window's sort."""
    grid = np.array([[3.0, 1.0, 3.0, 2.0, 1.0, 3.0]])
    model = DecayedQuantileForecaster(days=6 / P, quantile=0.5, half_life_steps=2, steps_per_day=P)
    age = np.arange(5, -1, -1, dtype=np.float64)
    weights = np.exp2(-age / 2)
    # The weight of the values up to 2, as a share of the whole: the quantile lies exactly on that step.
    model.quantile = float(weights[[1, 3, 4]].sum() / weights.sum())
    order = np.argsort(grid, axis=1)
    unsure = model._levels(order, np.take_along_axis(grid, order, axis=1))[1]
    assert unsure.tolist() == [True]
    shared = fit_together([model], grid, GridOrder(grid))[0]
    assert shared.level_.tolist() == model.fit(grid).level_.tolist()


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 2**31), st.integers(1, 3), st.integers(1, 40), st.integers(1, 13), st.integers(1, 2), st.booleans()
)
def test_sliding_tops_are_the_largest_values_of_each_window(
    seed: int, have: int, columns: int, width: int, places: int, ties: bool
) -> None:
    rng = np.random.default_rng(seed)
    values = rng.gamma(2.0, 1.0, size=(3, have, columns))
    values = np.round(values, 0) if ties else values
    values[rng.random(values.shape) < 0.2] = -np.inf  # missing, as `_tops` gives them
    per_column = -np.sort(-values, axis=1)  # each column's largest first
    width = min(width, columns)
    union = np.moveaxis(sliding_window_view(per_column, width, axis=2), 1, 2).reshape(3, columns - width + 1, -1)
    expected = _tops(union, places - 1)
    for got, want in zip(_sliding_tops(per_column, width, places), expected):
        np.testing.assert_array_equal(got, want)
