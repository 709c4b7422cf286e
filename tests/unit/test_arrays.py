"""The core's array helpers against the numpy calls they stand for."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recommender.arrays import maximum_at_cells

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
