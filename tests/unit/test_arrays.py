"""The core's array helpers against the numpy calls they stand for."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recommender.arrays import argsort_nan_last, maximum_at_cells, quantile_of, spliced

cells = st.tuples(st.integers(1, 6), st.integers(1, 9), st.integers(0, 60), st.integers(0, 2**32 - 1))


@given(cells)
def test_maximum_at_cells_equals_the_tuple_indexed_ufunc(shape_and_seed: tuple[int, int, int, int]) -> None:
    rows, columns, n, seed = shape_and_seed
    rng = np.random.default_rng(seed)
    at_rows, at_columns = rng.integers(0, rows, n), rng.integers(0, columns, n)
    values = rng.normal(size=n)
    values[rng.random(n) < 0.1] = np.inf
    expected = np.full((rows, columns), -np.inf)
    np.maximum.at(expected, (at_rows, at_columns), values)
    table = np.full((rows, columns), -np.inf)
    maximum_at_cells(table, at_rows, at_columns, values)
    np.testing.assert_array_equal(table, expected)


@pytest.mark.parametrize("column", [-1, 3])
def test_maximum_at_cells_refuses_a_column_outside_the_table(column: int) -> None:
    # The flat view would otherwise put the value in a neighbouring row.
    table = np.zeros((2, 3))
    with pytest.raises(IndexError, match=r"column outside 0\.\.2"):
        maximum_at_cells(table, np.array([0]), np.array([column]), np.array([1.0]))
    np.testing.assert_array_equal(table, 0.0)


def test_maximum_at_cells_refuses_a_strided_view() -> None:
    with pytest.raises(ValueError, match="C-contiguous"):
        maximum_at_cells(np.zeros((4, 4))[:, ::2], np.array([0]), np.array([0]), np.array([1.0]))


# Values from a few levels so that ties are common, with NaN, -inf and (in some draws) +inf among them.
sortable = st.lists(st.sampled_from([np.nan, -np.inf, np.inf, -1.5, 0.0, 0.25, 2.0, 7.0]), min_size=0, max_size=40)


@given(st.lists(sortable, min_size=1, max_size=4).filter(lambda rows: len({len(r) for r in rows}) == 1))
def test_argsort_nan_last_orders_values_as_numpys_argsort(rows: list[list[float]]) -> None:
    """Each row's order is a permutation that puts the values where numpy's argsort puts them (NaN last, after
    +inf); only equal values may come in another order."""
    values = np.asarray(rows, dtype=np.float64)
    order = argsort_nan_last(values, axis=1)
    np.testing.assert_array_equal(np.sort(order, axis=1), np.broadcast_to(np.arange(values.shape[1]), values.shape))
    expected = np.take_along_axis(values, np.argsort(values, axis=1), axis=1)
    np.testing.assert_array_equal(np.take_along_axis(values, order, axis=1), expected)


def test_argsort_nan_last_orders_a_grid_with_gaps_as_numpy_does() -> None:
    """The case it exists for (a usage grid with missing samples in most rows; its speed is in docs/benchmarks.md)."""
    rng = np.random.default_rng(7)
    grid = rng.random((400, 4032))
    grid[rng.random(grid.shape) < 0.01] = np.nan
    order = argsort_nan_last(grid, axis=1)
    np.testing.assert_array_equal(np.take_along_axis(grid, order, axis=1), np.sort(grid, axis=1))


@given(
    st.sampled_from([0, 1, 7, 40, 100_000]),
    st.lists(st.integers(0, 10**9), max_size=12, unique=True),
    st.lists(st.tuples(st.integers(0, 10**9), st.integers(-9, 9)), max_size=12),
)
def test_spliced_is_numpys_delete_then_insert(size: int, gone: list[int], inserted: list[tuple[int, int]]) -> None:
    """The cells kept copied by runs (long runs: 100,000 cells) or by numpy's masks (short ones), the new ones
    landing where `np.insert` puts them at the positions of the array before the deletion (several at one position:
    in their order), appended at the end too."""
    array = np.arange(size, dtype=np.int64) * 10
    cut = np.asarray(sorted({g % size for g in gone} if size else ()), dtype=np.int64)
    pairs = sorted((at % (size + 1), value) for at, value in inserted)
    at = np.asarray([p[0] for p in pairs], dtype=np.int64)
    new = np.asarray([p[1] for p in pairs], dtype=np.int64)
    expected = np.insert(np.delete(array, cut), at - np.searchsorted(cut, at), new)
    got = spliced(array, cut, at, new)
    assert got.dtype == array.dtype
    np.testing.assert_array_equal(got, expected)


def same_float(a: float, b: float) -> bool:
    return a == b or (np.isnan(a) and np.isnan(b))


@given(
    st.lists(
        st.floats(allow_nan=False, width=64) | st.sampled_from([0.0, 1.0, 2.5, np.inf, -np.inf]),
        min_size=1,
        max_size=300,
    ),
    st.floats(0.0, 1.0) | st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]),
    st.booleans(),
)
def test_quantile_of_is_numpys_quantile_bit_for_bit(values: list[float], q: float, nan: bool) -> None:
    array = np.array(values + [np.nan] * nan)
    with np.errstate(invalid="ignore", over="ignore"):
        assert same_float(quantile_of(array, q), float(np.quantile(array, q)))


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 1 - 1e-9])
def test_quantile_of_a_large_array_is_numpys_whether_its_sample_bounds_it_or_not(q: float) -> None:
    """Issue 41: above 4,096 values a sample bounds the order statistics read from below, and where it misses (here
    every sampled value is the largest) the whole array is read: numpy's value either way."""
    values = np.random.default_rng(2).lognormal(size=100_003)
    values[values > 1.0] = np.round(values[values > 1.0], 1)  # ties
    assert quantile_of(values, q) == np.quantile(values, q)
    values[:: values.size // 4096] = 1e9
    assert quantile_of(values, q) == np.quantile(values, q)
