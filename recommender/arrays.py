"""The array types the math is written in, named once for every layer's signatures."""

from __future__ import annotations

from math import isqrt
from typing import TypeVar

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
UInt64Array = npt.NDArray[np.uint64]
ScalarT = TypeVar("ScalarT", bound=np.generic)


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


#: Values `quantile_of` samples (evenly spaced) to bound the order statistics it reads from below.
_QUANTILE_SAMPLE = 4096


def quantile_of(values: FloatArray, q: float) -> float:
    """`float(np.quantile(values, q))` of a 1-D array, bit for bit (linear interpolation between the two order
    statistics around (n - 1) q; NaN where a value is NaN), partitioning only the values from a bound below those two:
    numpy partitions the whole array (100,000 values: 1.3 ms), while a high quantile's bound, found in an evenly spaced
    sample, leaves a few thousand (0.2 ms). The live line's fit asks for one a thousand times a resource."""
    n = values.size
    if n == 0 or np.isnan(values).any():  # numpy's error, or its NaN
        return float(np.quantile(values, q))
    virtual = (n - 1) * q
    top = virtual >= n - 1
    low = n - 1 if top else int(virtual)
    gamma = virtual - (-1 if top else low)  # as numpy computes it: its index of the last value is -1
    sample = values[:: max(n // _QUANTILE_SAMPLE, 1)]
    # A rank of the sample well below where the low order statistic falls in it: few values of the array lie under
    # the bound beyond what the sample's rank says, and where too many do, the whole array is partitioned.
    rank = sample.size * low // n - 4 * isqrt(sample.size)
    kept = values[values >= np.partition(sample, rank)[rank]] if rank > 0 else values
    if kept.size < n - low:
        kept = values
    first = low - (n - kept.size)  # the low order statistic's rank among the values kept
    second = first if top else first + 1
    ordered = np.partition(kept, (first, second))
    below, above = ordered[first], ordered[second]
    step = above - below
    # numpy's lerp: from the nearer end (`_lerp`).
    return float(above - step * (1 - gamma) if gamma >= 0.5 else below + step * gamma)


#: Cells `spliced` must have per cut (a cell gone counts twice: it ends a run and starts one) for copies by runs to
#: beat numpy's masked ones. Measured with a cell gone and one new per row: 48 cells a row, the masks take a tenth of
#: the runs' time; 240, the same; 2,000 (a week of 5-minute slots), the runs take a tenth of the masks'.
_CELLS_PER_RUN = 128


def spliced(
    array: npt.NDArray[ScalarT], gone: IntArray, at: IntArray, new: npt.NDArray[ScalarT]
) -> npt.NDArray[ScalarT]:
    """`array` without the cells at `gone` (sorted, distinct) and with `new` inserted before the cells at `at`
    (sorted; at `array.size`: appended), as `np.insert(np.delete(array, gone), ...)` at the positions `at` had before
    the deletion. Long runs of cells kept are copied a run at a time (a run per row, when each row loses and gains a
    cell): `np.delete` and `np.insert` copy them through boolean masks, ten times slower over a week of slots a row;
    short runs (under `_CELLS_PER_RUN` cells per cut) go through those masks, cheaper than a copy per run."""
    if array.size < _CELLS_PER_RUN * (2 * gone.size + at.size + 1):
        # Short runs (a histogram's few buckets a row): numpy's masked copies cost less than a copy per run.
        kept = np.delete(array, gone) if gone.size else array
        return np.insert(kept, at - np.searchsorted(gone, at), new)
    cuts = np.unique(np.concatenate([[0, array.size], gone, gone + 1, at]))
    out: npt.NDArray[ScalarT] = np.empty(array.size - gone.size + at.size, dtype=array.dtype)
    # Each insertion lands after the insertions before it and the kept cells before its position.
    out[at - np.searchsorted(gone, at) + np.arange(at.size)] = new
    kept = ~np.isin(cuts[:-1], gone)
    first, end = cuts[:-1][kept], cuts[1:][kept]
    lands = first - np.searchsorted(gone, first) + np.searchsorted(at, first, side="right")
    for to, begin, stop in zip(lands.tolist(), first.tolist(), end.tolist()):
        out[to : to + stop - begin] = array[begin:stop]
    return out
