"""The array types the math is written in, named once for every layer's signatures."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
UInt64Array = npt.NDArray[np.uint64]


def maximum_at_cells(table: FloatArray, rows: IntArray, columns: IntArray, values: FloatArray) -> None:
    """`np.maximum.at(table, (rows, columns), values)` in place, on the flat index: numpy's unbuffered 1-D fast path
    is about 5x quicker than the tuple-indexed one, and the grids it fills are tens of millions of samples."""
    if not table.flags.c_contiguous:
        raise ValueError("maximum_at_cells needs a C-contiguous table (it writes through a flat view)")
    if columns.size and (int(columns.min()) < 0 or int(columns.max()) >= table.shape[1]):
        # A column past the edge would land in the next row of the flat view instead of failing as a 2-D index does.
        raise IndexError(f"maximum_at_cells: a column outside 0..{table.shape[1] - 1}")
    np.maximum.at(table.reshape(-1), rows * table.shape[1] + columns, values)


def argsort_nan_last(values: FloatArray, axis: int = -1) -> npt.NDArray[np.intp]:
    """`np.argsort(values, axis)`: NaN last, equal values in an unspecified order. numpy's vectorized sort leaves an
    array holding a NaN to its scalar path (5x slower on usage grids, where some samples are always missing), so
    NaN is sorted as +inf, after every number, wherever no value is +inf."""
    missing = np.isnan(values)
    if not missing.any() or np.isposinf(values).any():
        return np.argsort(values, axis=axis)
    return np.argsort(np.where(missing, np.inf, values), axis=axis)
