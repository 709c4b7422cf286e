"""Forecasting models of a usage line, vectorised over every container of a fleet.

All forecasters share one shape of input: a usage grid, a (containers x steps) float array of 5-minute usage (max
over a workload's pods, NaN where there was no sample) whose last column ends at the decision time. `fit(grid)`
learns, `predict(n_steps)` returns a (containers x n_steps) line starting at the decision time. Everything positional:
step i of the forecast is "i steps after the decision", and a day is `steps_per_day` steps back.

- `FlatQuantileForecaster`: a constant line, the q-quantile of the last days (VPA, KRR and Koordinator mid are
  members of this family; a flat line is the robust fallback for containers without a daily rhythm).
- `WindowQuantileForecaster`: for each step, the q-quantile of the past days' usage in a window around the same
  time of day (spikes recur a few minutes early or late), floored by a fraction of a flat quantile.
- `StlForecaster`: statsmodels' STL decomposition (daily period) of hourly maxima; seasonal + last trend level +
  a residual quantile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Self, TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from recommender.arrays import FloatArray, IntArray, argsort_nan_last, maximum_at_cells

STEPS_PER_DAY = 288
_T = TypeVar("_T")
#: Values of the (rows x steps x window) array a `WindowQuantileForecaster` sorts at once (4M: 32 MB).
WINDOW_BLOCK_VALUES = 4_000_000


def nan_quantile(values: FloatArray, q: float) -> FloatArray:
    """The q-quantile along the last axis ignoring NaN, as the smallest sample with at least q of them at or below.

    (The "higher" rule: never below a sample a q-share of the data reaches; all-NaN rows give NaN.) A sort beats
    numpy's nanquantile by an order of magnitude on the (containers x steps x window) arrays used here.
    """
    return nan_quantiles(values, (q,))[0]


#: Distinct ranks up to which `nan_quantiles` partitions (each rank a partial sort) rather than sorts whole rows,
#: and the shortest rows it does so for (numpy's vectorised sort is faster on short rows: measured at 91 and 4,032).
PARTITION_MAX_RANKS = 8
PARTITION_MIN_ROW = 1024


def nan_quantiles(values: FloatArray, qs: tuple[float, ...]) -> list[FloatArray]:
    """`nan_quantile` at each of `qs`. Rows with as many known values share a rank, so on long rows a partition at
    the few distinct ranks (NaN sort last there too) puts the same values at those places as a sort, in a third of
    the time; a sort when the ranks are many or the rows short."""
    count = np.sum(~np.isnan(values), axis=-1)
    last = max(values.shape[-1] - 1, 0)
    ranks = [np.clip(np.ceil(q * count).astype(np.int64) - 1, 0, last) for q in qs]
    distinct = np.unique(np.concatenate([r.ravel() for r in ranks])) if values.size else np.empty(0, dtype=np.int64)
    depths = [count - 1 - rank for rank in ranks]
    if values.size and (deepest := max(int(np.max(d)) for d in depths)) <= TOP_MAX_DEPTH:
        return _pick_tops(_tops(values, max(deepest, 0)), depths, count)
    if values.size == 0:
        ordered = values
    elif distinct.size <= PARTITION_MAX_RANKS and values.shape[-1] >= PARTITION_MIN_ROW:
        ordered = np.partition(values, distinct, axis=-1)
    else:
        ordered = np.sort(values, axis=-1)
    out = []
    for rank in ranks:
        picked = (
            np.take_along_axis(ordered, rank[..., None], axis=-1)[..., 0]
            if values.size
            else np.full(count.shape, np.nan)
        )
        out.append(np.where(count > 0, picked, np.nan))
    return out


#: Places from the top (0: the max) up to which `nan_quantiles` takes maxima instead of sorting: a high quantile of a
#: short row (the 99th of at most 100 values is their max, of 101 to 200 the second largest).
TOP_MAX_DEPTH = 2


def _tops(values: FloatArray, deepest: int) -> list[FloatArray]:
    """The `deepest` + 1 largest of each row (last axis; NaN and -inf count as missing, -inf when none is left), by
    repeated maxima, taking one out each time (ties keep their multiplicity)."""
    if deepest == 0:
        top = np.max(np.where(np.isnan(values), -np.inf, values), axis=-1) if values.shape[-1] else values[..., 0]
        return [top]
    work = np.where(np.isnan(values), -np.inf, values)
    tops = []
    for place in range(deepest + 1):
        at = np.argmax(work, axis=-1)[..., None]
        tops.append(np.take_along_axis(work, at, axis=-1)[..., 0])
        if place < deepest:
            np.put_along_axis(work, at, -np.inf, axis=-1)
    return tops


def _pick_tops(tops: list[FloatArray], depths: list[IntArray], count: IntArray) -> list[FloatArray]:
    """For each of `depths`, the value that many places below the top (`_tops`); NaN for rows without any value."""
    return [np.where(count > 0, np.choose(np.clip(depth, 0, len(tops) - 1), tops), np.nan) for depth in depths]


#: Largest values per window up to which `window_quantile` slides them over the columns (`_sliding_tops`).
SLIDING_TOPS = 2


def _merge_tops(a: list[FloatArray], b: list[FloatArray]) -> list[FloatArray]:
    """The 1 or 2 largest values, with multiplicity, of the union of two sets given by theirs (largest first)."""
    first = np.maximum(a[0], b[0])
    if len(a) == 1:
        return [first]
    return [first, np.maximum(np.minimum(a[0], b[0]), np.maximum(a[1], b[1]))]


def _sliding_tops(per_column: FloatArray, width: int, places: int) -> list[FloatArray]:
    """The `places` (1 or 2) largest values, with multiplicity (-inf when fewer), of the union of each `width`
    consecutive columns of `per_column` (rows x its places x columns, each column's largest first).

    Van Herk / Gil-Werman: within blocks of `width` columns, running tops from each block's start and from its end;
    a window is the end of one block and the start of the next, two disjoint parts whose tops merge in a few
    element-wise operations, instead of a pass over every value of every window."""
    rows, have, columns = per_column.shape
    blocks = -(-columns // width)
    values = []
    for place in range(places):
        padded = np.full((rows, blocks * width), -np.inf)
        if place < have:
            padded[:, :columns] = per_column[:, place]
        values.append(padded.reshape(rows, blocks, width))
    forward, backward = [v.copy() for v in values], [v.copy() for v in values]
    for j in range(1, width):
        ahead = _merge_tops([f[..., j - 1] for f in forward], [v[..., j] for v in values])
        behind = _merge_tops([v[..., width - 1 - j] for v in values], [b[..., width - j] for b in backward])
        for place in range(places):
            forward[place][..., j], backward[place][..., width - 1 - j] = ahead[place], behind[place]
    start = np.arange(columns - width + 1)
    tail = [b.reshape(rows, -1)[:, start] for b in backward]
    head = [f.reshape(rows, -1)[:, start + width - 1] for f in forward]
    # A window that starts a block is that block, all in its tail.
    whole = start % width == 0
    return [np.where(whole, t, m) for t, m in zip(tail, _merge_tops(tail, head))]


def _day_tops(segments: FloatArray, places: int) -> list[FloatArray]:
    """The `places` (1 or 2) largest values across days (axis 1) of each row and column, with multiplicity (-inf
    when fewer): one running merge over the days, each a contiguous slice, instead of `_tops` across a strided axis."""
    rows, days, columns = segments.shape
    tops = [np.full((rows, columns), -np.inf) for _ in range(places)]
    for day in range(days):
        value = segments[:, day]
        value = np.where(np.isnan(value), -np.inf, value)
        tops = _merge_tops(tops, [value] + [np.full_like(value, -np.inf)] * (places - 1))
    return tops


def window_quantile(segments: FloatArray, width: int, q: float) -> FloatArray:
    """`nan_quantile` at each step of the union over days of a sliding window: `segments` (rows x days x (steps +
    width - 1)) gives, per step t, the values segments[:, :, t : t + width]; the result is rows x steps.

    A high quantile of such a union is one of its few largest values, and those are among the few largest of each
    column across days: so when the quantile lies within `TOP_MAX_DEPTH` of the top everywhere, only each column's
    largest values enter the windows (a fraction of the values, no sort); otherwise every value, sorted."""
    rows, days, columns = segments.shape
    known = ~np.isnan(segments)
    cumulative = np.concatenate([np.zeros((rows, 1), dtype=np.int64), np.cumsum(known.sum(axis=1), axis=1)], axis=1)
    count = cumulative[:, width:] - cumulative[:, :-width]
    rank = np.clip(np.ceil(q * count).astype(np.int64) - 1, 0, max(days * width - 1, 0))
    depth = count - 1 - rank
    deepest = int(depth[count > 0].max()) if (count > 0).any() else 0
    if deepest > TOP_MAX_DEPTH or not segments.size:
        windows = sliding_window_view(segments, width, axis=2)  # rows x days x steps x width
        return nan_quantile(np.moveaxis(windows, 1, 2).reshape(rows, columns - width + 1, days * width), q)
    if deepest < SLIDING_TOPS:
        per_column = np.stack(_day_tops(segments, min(deepest, days - 1) + 1), axis=1)  # rows x places x cols
        return _pick_tops(_sliding_tops(per_column, width, deepest + 1), [depth], count)[0]
    per_column = np.stack(_tops(np.moveaxis(segments, 1, 2), min(deepest, days - 1)), axis=1)
    places = per_column.shape[1]
    candidates = np.moveaxis(sliding_window_view(per_column, width, axis=2), 1, 2)  # rows x steps x places x width
    tops = _tops(candidates.reshape(rows, columns - width + 1, places * width), deepest)
    return _pick_tops(tops, [depth], count)[0]


def column_grid(
    frame: pd.DataFrame,
    column: str | None,
    group_codes: npt.NDArray[np.int64],
    shape: tuple[int, int],
    end_seconds: float,
    step_seconds: int,
) -> FloatArray:
    """A column of tidy usage rows (`group_codes` per row) as a `usage_grid` of `shape`; all NaN where the frame has
    no such column (an optional one: limits, throttling) or `column` is None."""
    if column is None or column not in frame.columns:
        return np.full(shape, np.nan)
    times, values = (frame[name].to_numpy(dtype=np.float64) for name in ("timestamp", column))
    return usage_grid(group_codes, times, values, shape[0], end_seconds, shape[1], step_seconds)


def usage_grid(
    group_codes: npt.NDArray[np.int64],
    times: FloatArray,
    values: FloatArray,
    n_groups: int,
    end_seconds: float,
    n_steps: int,
    step_seconds: int,
) -> FloatArray:
    """Samples as a (groups x n_steps) grid of per-step maxima ending just before `end_seconds`; NaN where none.
    Samples of a negative group code are left out (groups that are not forecast)."""
    grid = np.full((n_groups, n_steps), -np.inf)
    slot = np.floor((times - end_seconds) / step_seconds).astype(np.int64) + n_steps
    inside = (slot >= 0) & (slot < n_steps) & ~np.isnan(values) & (group_codes >= 0)
    maximum_at_cells(grid, group_codes[inside], slot[inside], values[inside])
    result: FloatArray = np.where(np.isfinite(grid), grid, np.nan)
    return result


def check_grid(X: Any, estimator: str) -> FloatArray:
    grid = np.asarray(X, dtype=np.float64)
    if grid.ndim != 2:
        raise ValueError(f"{estimator} expects a 2-D (containers x steps) usage grid, got shape {grid.shape}")
    return grid


def repeat_daily(profile: FloatArray, n_steps: int) -> FloatArray:
    """A (containers x steps_per_day) daily profile repeated over n_steps."""
    reps = int(np.ceil(n_steps / profile.shape[1])) if profile.shape[1] else 0
    result: FloatArray = np.tile(profile, (1, reps))[:, :n_steps]
    return result


class SharedFit:
    """One grid's intermediate results, computed once for every candidate fitted on it (`fit_together`): candidates
    of one family differ in a parameter applied after the costly part (the decayed quantiles' half-lives after one
    sort, the time-of-day windows' floors after one windowed quantile), and flat quantiles of the same last steps
    recur across families. Keys are what the result depends on, so a shared result is the one each would compute."""

    def __init__(self, grid: FloatArray, order: GridOrder | None = None) -> None:
        self.grid = grid
        #: The sort of a grid whose first columns this grid is (the backtest's origins cut one grid), or None.
        self.order = order
        self._memo: dict[tuple[object, ...], Any] = {}

    def recent(self, n_steps: int) -> FloatArray:
        """The last `n_steps` columns (all when the grid is narrower)."""
        result: FloatArray = self.grid[:, -max(n_steps, 1) :]
        return result

    def quantile(self, n_steps: int, q: float) -> FloatArray:
        """`nan_quantile` of the last `n_steps` columns: from the grid's largest values (`GridOrder.top`) where
        they hold the rank, the window itself for the other rows."""
        n_steps = min(max(n_steps, 1), self.grid.shape[1])
        return self.once(("quantile", n_steps, q), lambda: self._quantile(n_steps, q))

    def _quantile(self, n_steps: int, q: float) -> FloatArray:
        if self.order is None:
            return _flat_quantile(self.recent(n_steps), q)
        top = self.top(n_steps)
        count = top.known
        rank = np.clip(np.ceil(q * count).astype(np.int64) - 1, 0, max(n_steps - 1, 0))
        # The (depth + 1)-th largest known value of the window: the entry of the top where that many are inside.
        hit = top.inside & (top.seen == (count - rank)[:, None])
        at = np.argmax(hit, axis=1)
        every = np.arange(count.size)
        level = np.where(count > 0, top.values[every, at], np.nan)
        rest = np.flatnonzero(~hit[every, at] & (count > 0))
        if rest.size:
            level[rest] = _flat_quantile(self.recent(n_steps)[rest], q)
        return level

    def top(self, n_steps: int) -> WindowTop:
        """The grid's largest values (`GridOrder.top`) as they fall in the window of the last `n_steps` columns."""
        n_steps = min(max(n_steps, 1), self.grid.shape[1])
        assert self.order is not None
        order = self.order
        return self.once(("top", n_steps), lambda: order.window_top(self.grid.shape[1] - n_steps, self.grid.shape[1]))

    def sorted_recent(self, n_steps: int, rows: IntArray | None = None) -> tuple[npt.NDArray[np.intp], FloatArray]:
        """The argsort (NaN last) of each row (or of `rows`) of the last `n_steps` columns and the sorted values."""

        def sort() -> tuple[npt.NDArray[np.intp], FloatArray]:
            window = self.recent(n_steps) if rows is None else self.recent(n_steps)[rows]
            end = self.grid.shape[1]
            order = (
                argsort_nan_last(window, axis=1)
                if self.order is None
                else self.order.window(end - window.shape[1], end, rows)
            )
            return order, np.take_along_axis(window, order, axis=1)

        key = None if rows is None else rows.tobytes()
        return self.once(("sorted", min(max(n_steps, 1), self.grid.shape[1]), key), sort)

    def known(self, n_steps: int) -> FloatArray:
        """1.0 where the last `n_steps` columns hold a value, else 0.0."""
        return self.once(("known", n_steps), lambda: (~np.isnan(self.recent(n_steps))).astype(np.float64))

    def once(self, key: tuple[object, ...], make: Callable[[], _T]) -> _T:
        """`make()`, computed the first time `key` is asked for."""
        if key not in self._memo:
            self._memo[key] = make()
        result: _T = self._memo[key]
        return result


#: The largest known values per row that `GridOrder.top` keeps: a high quantile of a window of the grid is read from
#: them when that many of them fall inside it (the 99th percentile of 14 days is the 41st largest of 4,032 values).
TOP_VALUES = 256


class WindowTop(NamedTuple):
    """The grid's `TOP_VALUES` largest known values per row, largest first (`values`, NaN past a row's known ones),
    whether each lies in a window of columns (`inside`), how many of them so far do (`seen`), and the window's
    known values per row (`known`)."""

    values: FloatArray
    positions: npt.NDArray[np.int32]
    inside: npt.NDArray[np.bool_]
    seen: IntArray
    known: IntArray


class GridOrder:
    """Each row's argsort of a grid (NaN last), computed once, from which the order of any window of its columns is
    read by keeping, in that order, the positions inside the window: the backtest fits windows of one grid at each
    origin, and keeping costs a tenth of a sort. Equal values may come out in another order than a sort of the
    window would give them (`DecayedQuantileForecaster` checks where that could matter). A high quantile only
    needs a window's largest values, and those are mostly among the grid's (`top`, `window_top`)."""

    def __init__(self, grid: FloatArray) -> None:
        self.grid = grid
        self._order: npt.NDArray[np.int32] | None = None
        self._top: tuple[FloatArray, npt.NDArray[np.int32]] | None = None
        self._known: npt.NDArray[np.int32] | None = None

    def order(self) -> npt.NDArray[np.int32]:
        if self._order is None:
            # Sorted a block of rows at a time: the int64 argsort's temporary stays a block's.
            rows, width = self.grid.shape
            self._order = np.empty((rows, width), dtype=np.int32)
            block = max(1, WINDOW_BLOCK_VALUES // max(width, 1))
            for first in range(0, rows, block):
                self._order[first : first + block] = argsort_nan_last(self.grid[first : first + block], axis=1)
        return self._order

    def window(self, start: int, stop: int, rows: IntArray | None = None) -> npt.NDArray[np.intp]:
        """The order of the values of columns [start, stop) of each row (or of `rows`), as positions within the
        window."""
        order = self.order() if rows is None else self.order()[rows]
        inside = (order >= start) & (order < stop)
        return order[inside].reshape(order.shape[0], stop - start).astype(np.intp) - start

    def top(self) -> tuple[FloatArray, npt.NDArray[np.int32]]:
        """Each row's `TOP_VALUES` largest known values, largest first, and their columns (NaN and -1 past the
        row's known values)."""
        if self._top is None:
            order = self.order()
            width = self.grid.shape[1]
            known = np.count_nonzero(~np.isnan(self.grid), axis=1)
            place = known[:, None] - 1 - np.arange(min(TOP_VALUES, width))[None, :]
            positions = np.where(place >= 0, np.take_along_axis(order, np.maximum(place, 0), axis=1), -1)
            values = np.where(place >= 0, np.take_along_axis(self.grid, np.maximum(positions, 0), axis=1), np.nan)
            self._top = values, positions.astype(np.int32)
        return self._top

    def window_top(self, start: int, stop: int) -> WindowTop:
        """`top` as it falls in columns [start, stop)."""
        if self._known is None:
            known = np.zeros((self.grid.shape[0], self.grid.shape[1] + 1), dtype=np.int32)
            np.cumsum(~np.isnan(self.grid), axis=1, out=known[:, 1:])
            self._known = known
        values, positions = self.top()
        inside = (positions >= start) & (positions < stop)
        count = (self._known[:, stop] - self._known[:, start]).astype(np.int64)
        return WindowTop(values, positions, inside, np.cumsum(inside, axis=1), count)


def _flat_quantile(window: FloatArray, q: float) -> FloatArray:
    """`nan_quantile` of each row; the max (as `nan_quantile` gives it) without a sort when q >= 1."""
    if q >= 1.0:
        result: FloatArray = np.fmax.reduce(window, axis=1) if window.shape[1] else np.full(window.shape[0], np.nan)
        return result
    return nan_quantile(window, q)


def fit_together(candidates: Sequence[BaseEstimator], X: Any, order: GridOrder | None = None) -> list[BaseEstimator]:
    """Clones of `candidates`, each fitted on the grid X as its own `fit` would, sharing what they have in common
    (`SharedFit`; `order`: the sort of a grid whose first columns X is)."""
    shared = SharedFit(check_grid(X, "fit_together"), order)
    fitted = []
    for candidate in candidates:
        model = clone(candidate)
        fitted.append(model.fit_shared(shared) if hasattr(model, "fit_shared") else model.fit(shared.grid))
    return fitted


class _ConstantLine(BaseEstimator):  # type: ignore[misc]
    """A line that holds one fitted `level_` per container over any horizon, learned from the last `days` days."""

    days: float
    steps_per_day: int
    level_: FloatArray

    def _steps(self) -> int:
        return int(self.days * self.steps_per_day)

    def fit(self, X: Any, y: Any = None) -> Self:
        return self.fit_shared(SharedFit(check_grid(X, type(self).__name__)))

    def fit_shared(self, shared: SharedFit) -> Self:
        raise NotImplementedError

    def predict(self, n_steps: int) -> FloatArray:
        check_is_fitted(self, "level_")
        result: FloatArray = np.repeat(self.level_[:, None], n_steps, axis=1)
        return result


class FlatQuantileForecaster(_ConstantLine):
    """A constant line per container: the `quantile` of its last `days` days."""

    def __init__(self, days: float = 7.0, quantile: float = 0.99, steps_per_day: int = STEPS_PER_DAY) -> None:
        self.days = days
        self.quantile = quantile
        self.steps_per_day = steps_per_day

    def fit_shared(self, shared: SharedFit) -> Self:
        self.level_ = shared.quantile(self._steps(), self.quantile)
        return self


class MultiWindowQuantileForecaster(_ConstantLine):
    """A constant line: the mean of the `quantile` over `windows` windows from `shortest_days` to `days` (geometric
    spacing). A recent level shift counts at once (short windows) without forgetting a burst of last week (long
    ones); the mean is steadier than any one window, which matters at a 1 % risk, where single days decide."""

    def __init__(
        self,
        days: float = 14.0,
        shortest_days: float = 1.0,
        windows: int = 4,
        quantile: float = 0.99,
        steps_per_day: int = STEPS_PER_DAY,
    ) -> None:
        self.days = days
        self.shortest_days = shortest_days
        self.windows = windows
        self.quantile = quantile
        self.steps_per_day = steps_per_day

    def fit_shared(self, shared: SharedFit) -> Self:
        # Each span's last steps within the window of `days` (a span is at most `days`).
        spans = np.geomspace(self.shortest_days, self.days, max(self.windows, 1))
        steps = max(self._steps(), 1)
        levels = [shared.quantile(min(max(int(d * self.steps_per_day), 1), steps), self.quantile) for d in spans]
        stacked = np.stack(levels)
        known = ~np.isnan(stacked)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.level_ = np.where(
                known.any(axis=0), np.where(known, stacked, 0.0).sum(axis=0) / known.sum(axis=0), np.nan
            )
        return self


class DecayedQuantileForecaster(_ConstantLine):
    """A constant line: the weighted `quantile` of the last `days` days, a sample's weight halving every
    `half_life_steps` of age (Koordinator's mid rule without its buckets: recent level shifts count most)."""

    def __init__(
        self,
        days: float = 7.0,
        quantile: float = 0.98,
        half_life_steps: int = STEPS_PER_DAY,
        steps_per_day: int = STEPS_PER_DAY,
    ) -> None:
        self.days = days
        self.quantile = quantile
        self.half_life_steps = half_life_steps
        self.steps_per_day = steps_per_day

    def fit_shared(self, shared: SharedFit) -> Self:
        rows = None
        if shared.order is not None:
            # From the grid's largest values: rows whose quantile they settle need no sort of their window.
            self.level_, settled = self._top_levels(shared)
            rows = np.flatnonzero(~settled)
            if not rows.size:
                return self
        else:
            self.level_ = np.full(shared.grid.shape[0], np.nan)
        # The sort is the costly part and does not depend on the half-life: candidates differing in it share it.
        order, ordered = shared.sorted_recent(self._steps(), rows)  # NaN last, with weight 0
        levels, unsure = self._levels(order, ordered)
        if unsure.any():
            # Equal values in another order add their weights in another order: where the quantile's weight lies
            # within rounding of a step of the cumulative weights, the row is sorted on its own, as its window is.
            window = shared.recent(self._steps())[unsure if rows is None else rows[unsure]]
            exact = argsort_nan_last(window, axis=1)
            levels[unsure] = self._levels(exact, np.take_along_axis(window, exact, axis=1))[0]
        self.level_[slice(None) if rows is None else rows] = levels
        return self

    def _top_levels(self, shared: SharedFit) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """The weighted quantile of each row from the grid's largest values of its window (`SharedFit.top`), and
        whether it is settled there: the smallest value whose weight at or below it reaches `quantile` of the whole,
        i.e. the first value from the top where the weight above and at it passes the rest (1 - quantile). Settled
        where that happens within the top values, away from rounding (more than twice `_levels`' 1e-9 of the
        weight from a step), so the level is the one a sort of the window gives; the other rows are sorted."""
        steps = min(max(self._steps(), 1), shared.grid.shape[1])
        top = shared.top(steps)
        end = shared.grid.shape[1]
        age = np.arange(steps - 1, -1, -1, dtype=np.float64)
        weight = np.exp2(-age / self.half_life_steps)
        total = shared.once(
            ("known weight", steps, self.half_life_steps), lambda: np.einsum("ij,j->i", shared.known(steps), weight)
        )
        above = np.where(top.inside, np.exp2(-(end - 1 - top.positions) / self.half_life_steps), 0.0)
        cumulative = np.cumsum(above, axis=1)
        rest = (1.0 - self.quantile) * total
        passed = cumulative > rest[:, None]
        at = np.argmax(passed, axis=1)
        every = np.arange(at.size)
        before = np.where(at > 0, cumulative[every, np.maximum(at - 1, 0)], 0.0)
        gap = np.minimum(cumulative[every, at] - rest, rest - before)
        known = top.known > 0
        settled = ~known | (passed[every, at] & (gap > 2e-9 * total))
        return np.where(known, top.values[every, at], np.nan), settled

    def _levels(self, order: npt.NDArray[np.intp], ordered: FloatArray) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """The weighted quantile of each row from its sort, and whether it lies within 1e-9 of the row's weight of
        a step of its cumulative weights (where the order of equal values could move it)."""
        rows, width = ordered.shape
        if not width:
            return np.full(rows, np.nan), np.zeros(rows, dtype=bool)
        age = np.arange(width - 1, -1, -1, dtype=np.float64)
        # NaN sort last: the cumulative weight of the known values ends at the count's position (the later
        # weights are never read), and the rank is where it first reaches the quantile's weight, by binary search.
        count = np.sum(~np.isnan(ordered), axis=1)
        cumulative = np.cumsum(np.exp2(-age / self.half_life_steps)[order], axis=1)
        every = np.arange(rows)
        total = np.where(count > 0, cumulative[every, np.maximum(count - 1, 0)], 0.0)
        target = self.quantile * total
        low, high = np.zeros(rows, dtype=np.int64), count.astype(np.int64)
        while (active := low < high).any():
            middle = (low + high) // 2
            below = cumulative[every, np.minimum(middle, width - 1)] < target
            low = np.where(active & below, middle + 1, low)
            high = np.where(active & ~below, middle, high)
        rank = np.minimum(low, width - 1)
        known = total > 0
        at, before = cumulative[every, rank], cumulative[every, np.maximum(rank - 1, 0)]
        gap = np.minimum(np.abs(at - target), np.where(rank > 0, np.abs(target - before), np.inf))
        return np.where(known, ordered[every, rank], np.nan), known & (gap <= 1e-9 * total)


class DecayedPeakForecaster(_ConstantLine):
    """A constant line: the weighted `quantile` of the peaks of the last `days` whole days before the grid's end, a
    day's weight halving every `half_life_steps` of its age (VPA's memory rule, one peak per day, without its
    buckets: a day's peak counts whatever its hour, so a nightly job's peak is never outvoted by quiet samples)."""

    def __init__(
        self,
        days: float = 8.0,
        quantile: float = 0.9,
        half_life_steps: int = STEPS_PER_DAY,
        steps_per_day: int = STEPS_PER_DAY,
    ) -> None:
        self.days = days
        self.quantile = quantile
        self.half_life_steps = half_life_steps
        self.steps_per_day = steps_per_day

    def fit_shared(self, shared: SharedFit) -> Self:
        per_day, grid = self.steps_per_day, shared.grid
        n_days = min(int(self.days), -(-grid.shape[1] // per_day))
        width = n_days * per_day
        block = np.full((grid.shape[0], width), np.nan)
        block[:, width - min(width, grid.shape[1]) :] = grid[:, grid.shape[1] - min(width, grid.shape[1]) :]
        peaks = np.fmax.reduce(block.reshape(grid.shape[0], n_days, per_day), axis=2) if n_days else block
        age = np.arange(n_days - 1, -1, -1, dtype=np.float64) * per_day  # the newest day ends at the grid's end
        weight = np.where(np.isnan(peaks), 0.0, np.exp2(-age / self.half_life_steps)[None, :])
        order = argsort_nan_last(peaks, axis=1)
        ordered, cumulative = (
            np.take_along_axis(peaks, order, axis=1),
            np.cumsum(np.take_along_axis(weight, order, 1), 1),
        )
        total = cumulative[:, -1] if n_days else np.zeros(grid.shape[0])
        rank = np.minimum(np.sum(cumulative < (self.quantile * total)[:, None], axis=1), max(n_days - 1, 0))
        level = ordered[np.arange(grid.shape[0]), rank] if n_days else np.full(grid.shape[0], np.nan)
        self.level_ = np.where(total > 0, level, np.nan)
        return self


class WindowQuantileForecaster(BaseEstimator):  # type: ignore[misc]
    """Seasonal line: per step, the `quantile` of the last `days` days within +- `window_steps` of that time of day.

    Floored by `floor_fraction` x the flat `floor_quantile` of the same days, so a quiet slot never gets a line
    near zero that the next burst tears through (at a matched violation rate such slots cost the most).
    """

    def __init__(
        self,
        days: int = 7,
        window_steps: int = 6,
        quantile: float = 0.99,
        floor_quantile: float = 0.99,
        floor_fraction: float = 0.7,
        steps_per_day: int = STEPS_PER_DAY,
    ) -> None:
        self.days = days
        self.window_steps = window_steps
        self.quantile = quantile
        self.floor_quantile = floor_quantile
        self.floor_fraction = floor_fraction
        self.steps_per_day = steps_per_day

    def fit(self, X: Any, y: Any = None) -> Self:
        return self.fit_shared(SharedFit(check_grid(X, type(self).__name__)))

    def fit_shared(self, shared: SharedFit) -> Self:
        # The windowed quantile is the costly part; candidates differing only in the floor share it.
        key = ("seasonal", self.days, self.window_steps, self.quantile, self.steps_per_day)
        seasonal = shared.once(key, lambda: self._seasonal_blocks(shared.grid))
        floor = self.floor_fraction * shared.quantile(self.days * self.steps_per_day, self.floor_quantile)
        self.profile_ = np.fmax(seasonal, floor[:, None])
        return self

    def _seasonal_blocks(self, grid: FloatArray) -> FloatArray:
        """`_seasonal` of every row: rows are independent, so blocks of them bound the (rows x steps x window) array
        to tens of MB whatever the fleet."""
        per_day = self.steps_per_day
        block = max(1, WINDOW_BLOCK_VALUES // max(per_day * self.days * (2 * self.window_steps + 1), 1))
        if not grid.shape[0]:
            return np.zeros((0, per_day))
        return np.concatenate([self._seasonal(grid[rows : rows + block]) for rows in range(0, grid.shape[0], block)])

    def _seasonal(self, grid: FloatArray) -> FloatArray:
        """The windowed quantile per row and time of day over the last `days` days of `grid`."""
        per_day, half = self.steps_per_day, self.window_steps
        n_groups, n = grid.shape
        # Per day back, the positions of the same time of day widened by the window; future or pre-history is NaN.
        segments = np.full((n_groups, self.days, per_day + 2 * half), np.nan)
        for day in range(1, self.days + 1):
            start = n - day * per_day - half
            lo, hi = max(start, 0), min(start + per_day + 2 * half, n)
            if hi > lo:
                segments[:, day - 1, lo - start : hi - start] = grid[:, lo:hi]
        return window_quantile(segments, 2 * half + 1, self.quantile)

    def predict(self, n_steps: int) -> FloatArray:
        check_is_fitted(self, "profile_")
        return repeat_daily(self.profile_, n_steps)


class StlForecaster(BaseEstimator):  # type: ignore[misc]
    """statsmodels STL on hourly maxima (daily period): seasonal profile + last trend + residual `quantile`.

    Non-robust STL: the robust loop costs 8x (35 ms a container) and the residual quantile carries the bursts.

    Hourly maxima keep the fit cheap (168 points a week) and tolerate spikes a few minutes off their slot.
    Containers with under two days of hourly data, or a flat series, get the flat quantile of what they have.
    """

    def __init__(
        self, days: int = 7, quantile: float = 0.99, steps_per_day: int = STEPS_PER_DAY, hours_per_day: int = 24
    ) -> None:
        self.days = days
        self.quantile = quantile
        self.steps_per_day = steps_per_day
        self.hours_per_day = hours_per_day

    def fit(self, X: Any, y: Any = None) -> Self:
        from statsmodels.tsa.seasonal import STL

        grid = check_grid(X, type(self).__name__)
        per_hour = self.steps_per_day // self.hours_per_day
        n_hours = self.days * self.hours_per_day
        recent = grid[:, -n_hours * per_hour :]
        padded = np.full((grid.shape[0], n_hours * per_hour), np.nan)
        padded[:, padded.shape[1] - recent.shape[1] :] = recent
        blocks = padded.reshape(grid.shape[0], n_hours, per_hour)
        hourly = np.where(np.isnan(blocks), -np.inf, blocks).max(axis=2)
        hourly[~np.isfinite(hourly)] = np.nan
        profile = np.repeat(nan_quantile(hourly, self.quantile)[:, None], self.hours_per_day, axis=1)
        for i, series in enumerate(hourly):
            known = ~np.isnan(series)
            if known.sum() < 2 * self.hours_per_day or np.nanstd(series) == 0:
                continue
            # Whole days of the most recent hours, gaps interpolated (a new container's leading NaNs are cut off).
            whole_days = int(known.sum()) // self.hours_per_day * self.hours_per_day
            filled = pd.Series(series).interpolate(limit_direction="both").to_numpy()[-whole_days:]
            result = STL(filled, period=self.hours_per_day).fit()
            seasonal = np.asarray(result.seasonal)[-self.hours_per_day :]
            residual = np.asarray(result.resid)
            profile[i] = np.asarray(result.trend)[-1] + seasonal + np.quantile(residual, self.quantile)
        # The profile's hour h is the h-th hour after the decision: the last day of the fit ends at the decision.
        self.profile_ = np.maximum(np.repeat(profile, per_hour, axis=1), 0.0)
        return self

    def predict(self, n_steps: int) -> FloatArray:
        check_is_fitted(self, "profile_")
        return repeat_daily(self.profile_, n_steps)
