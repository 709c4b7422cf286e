"""Reservation lines of Koordinator's resource model: long-term (its mid rule) and a first short-term forecast.

Long-term: the p95 (CPU) / p98 (memory) of a decaying histogram x 1.10, as Koordinator's mid resources use.
Short-term: for each 5-minute step of the horizon, the max of (a) the usage of the last hour ("fast up") and
(b) the usage at the same time of day on each of the last days, taken over a window around that time because
daily spikes come a few minutes early or late. Honest, cheap and seasonal; the forecasting models refine it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from models._validation import factorize_groups, require_columns, united_labels
from models.histogram import DecayingHistogram
from models.migration import migrate_seasonal_state
from recommender.arrays import FloatArray, IntArray, spliced

SECONDS_PER_DAY = 86400


class PercentileReservation(BaseEstimator):  # type: ignore[misc]
    """A constant line per group: percentile of a decaying histogram x (1 + margin). Koordinator mid by default."""

    def __init__(
        self,
        percentile: float = 0.95,
        margin_fraction: float = 0.10,
        half_life_seconds: float = 12 * 3600.0,
        first_bucket_size: float = 0.01,
        max_value: float = 1000.0,
        bucket_growth_ratio: float = 0.05,
        sample_weight: float = 1.0,
        epsilon: float = 1e-4,
    ) -> None:
        self.percentile = percentile
        self.margin_fraction = margin_fraction
        self.half_life_seconds = half_life_seconds
        self.first_bucket_size = first_bucket_size
        self.max_value = max_value
        self.bucket_growth_ratio = bucket_growth_ratio
        self.sample_weight = sample_weight
        self.epsilon = epsilon

    def fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        self.histogram_ = DecayingHistogram(
            first_bucket_size=self.first_bucket_size,
            max_value=self.max_value,
            bucket_growth_ratio=self.bucket_growth_ratio,
            half_life_seconds=self.half_life_seconds,
            sample_weight=self.sample_weight,
            epsilon=self.epsilon,
        ).fit(X)
        self.groups_ = self.histogram_.groups_
        return self

    def partial_fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        if not hasattr(self, "histogram_"):
            return self.fit(X)
        self.histogram_.partial_fit(X)
        self.groups_ = self.histogram_.groups_
        return self

    def predict(self, groups: npt.ArrayLike | None = None) -> FloatArray:
        """The line's value for each group (all fitted groups in `groups_` order when none are named)."""
        check_is_fitted(self, "histogram_")
        values = self.histogram_.quantile(self.percentile) * (1.0 + self.margin_fraction)
        if groups is None:
            return values
        index = pd.Index(self.groups_).get_indexer(pd.Index(np.asarray(groups, dtype=str)))
        if np.any(index < 0):
            raise KeyError("unknown group(s) asked of PercentileReservation")
        result: FloatArray = values[index]
        return result


class SeasonalMaxReservation(BaseEstimator):  # type: ignore[misc]
    """Short-term line: the seasonal max of past days around each time of day, lifted when usage runs above it.

    For each step, the seasonal value is the max over the last `seasonal_days` days of a window of
    +- `slot_tolerance_seconds` around the same time of day (spikes recur a few minutes early or late). When the
    last `recent_window_seconds` ran higher than the same window on those days, the whole line is lifted by the
    difference ("fast up"), and the first window of the horizon never drops below the recent max.
    `fit` keeps, per group, the per-slot max of the last `seasonal_days` days on a grid of `step_seconds`
    (pods pooled: the line must cover every pod of the workload). `predict(as_of, horizon_seconds)` returns a
    (groups x steps) array starting at `as_of`. Steps with no seasonal or recent data fall back to the max of the
    group's own last `seasonal_days` days of samples.

    The grid is kept sparse, as its observed cells (row pointers `cell_starts_`, then each cell's slot and value,
    sorted by group and slot): a dense one costs 16 KB a group (about 2,000 slots) however few its samples, 1.6 GB
    for 100,000 containers of one sample. Only blocks of `BLOCK_ROWS` groups are ever made dense, to predict.
    """

    groups_: npt.NDArray[np.str_]
    cell_starts_: IntArray
    cell_slots_: IntArray
    cell_values_: FloatArray
    n_slots_: int
    grid_origin_: float
    data_end_: float
    fallback_: FloatArray

    #: Groups made dense at once by `predict` (each a row of `n_slots_` floats and the window maxima's copies of it):
    #: about 16 MB a copy, whatever the fleet's size.
    BLOCK_ROWS = 1024

    def __init__(
        self,
        step_seconds: int = 300,
        recent_window_seconds: int = 3600,
        seasonal_days: int = 7,
        slot_tolerance_seconds: int = 900,
    ) -> None:
        self.step_seconds = step_seconds
        self.recent_window_seconds = recent_window_seconds
        self.seasonal_days = seasonal_days
        self.slot_tolerance_seconds = slot_tolerance_seconds

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(migrate_seasonal_state(state))

    def fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        learned = ("groups_", "cell_starts_", "cell_slots_", "cell_values_", "n_slots_", "grid_origin_", "data_end_")
        for name in (*learned, "fallback_"):
            if hasattr(self, name):
                delattr(self, name)
        return self.partial_fit(X)

    def partial_fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        """Add newer samples: the grid slides forward to the newest sample, keeping what still falls inside it."""
        require_columns(X, ("group", "timestamp", "value"), type(self).__name__)
        all_codes, new_labels = factorize_groups(X["group"])
        previous = hasattr(self, "cell_starts_")
        labels, positions = united_labels(self.groups_ if previous else np.zeros(0, dtype=str), new_labels)
        all_codes = positions[all_codes]
        present = X["value"].notna().to_numpy()
        group_codes = all_codes[present]
        times = X["timestamp"].to_numpy(dtype=np.float64)[present]
        values = X["value"].to_numpy(dtype=np.float64)[present]
        step = self.step_seconds
        end = float(X["timestamp"].max()) if len(X) else 0.0
        if previous:
            end = max(end, self.data_end_)
        n_slots = (self.seasonal_days * SECONDS_PER_DAY + self.slot_tolerance_seconds) // step + 2
        origin = (np.floor(end / step) - n_slots + 1) * step
        inside = times >= origin
        if previous:
            cells, shift = self._slid(origin, n_slots, len(labels))
        else:
            cells, shift = _Cells(np.zeros(len(labels) + 1, np.int64), np.zeros(0, np.int64), np.zeros(0)), 0
        starts, cell_slots, cell_values = _merged(
            cells,
            shift,
            group_codes[inside],
            ((times[inside] - origin) // step).astype(np.int64),
            values[inside],
            n_slots,
        )
        # A group whose samples all predate the grid (a workload that stopped) falls back to the max of its own
        # last `seasonal_days` days, so its line stays of the size it last needed rather than its last sample.
        own_end = np.full(len(labels), -np.inf)
        np.maximum.at(own_end, group_codes, times)
        own_recent = times >= own_end[group_codes] - self.seasonal_days * SECONDS_PER_DAY
        fallback = np.full(len(labels), -np.inf)
        np.maximum.at(fallback, group_codes[own_recent], values[own_recent])
        if previous:
            # Groups with new samples: the max of what the slid grid holds of them; others keep their fallback.
            old_fallback = np.full(len(labels), np.nan)
            old_fallback[: len(self.fallback_)] = self.fallback_
            seen_now = np.isfinite(fallback)
            grid_max = np.full(len(labels), -np.inf)
            filled = np.flatnonzero(np.diff(starts) > 0)
            if filled.size:
                grid_max[filled] = np.maximum.reduceat(cell_values, starts[filled])
            fallback = np.where(seen_now, np.fmax(fallback, grid_max), old_fallback)
        self.groups_ = labels
        self.cell_starts_ = starts
        self.cell_slots_ = cell_slots
        self.cell_values_ = cell_values
        self.n_slots_ = int(n_slots)
        self.grid_origin_ = float(origin)
        self.data_end_ = end
        self.fallback_ = np.where(np.isfinite(fallback), fallback, np.nan)
        return self

    def _slid(self, origin: float, n_slots: int, n_groups: int) -> tuple[_Cells, int]:
        """The kept cells for a grid starting at `origin`, row pointers for `n_groups` groups (new ones empty), and
        the whole slots they move by. The grid moves forward (a live pass: a slot or so): the kept cells as they are,
        with the first of each row still to drop (`_Cells.keep_from`) and the shift still to apply, so `_merged`
        copies the cells once; otherwise (settings changed) moved and cut here, and no shift left."""
        shift = int(round((origin - self.grid_origin_) / self.step_seconds))
        starts = self.cell_starts_
        starts = np.concatenate([starts, np.full(n_groups + 1 - starts.size, starts[-1])])
        if shift >= 0 and n_slots >= self.n_slots_:
            # Only the slots before `shift` leave: each row's first cells (its slots are sorted), found by a binary
            # search per row rather than a comparison of every cell.
            keep_from = _first_at_or_after(self.cell_slots_, starts[:-1], starts[1:], np.full(n_groups, shift))
            return _Cells(starts, self.cell_slots_, self.cell_values_, keep_from), shift
        slots = self.cell_slots_ - shift
        kept = (slots >= 0) & (slots < n_slots)
        if not kept.all():
            gone = np.flatnonzero(~kept)
            starts = starts - np.searchsorted(gone, starts)
            return _Cells(starts, slots[kept], self.cell_values_[kept]), 0
        return _Cells(starts, slots, self.cell_values_), 0

    def _cells(self, rows: IntArray, from_slot: int | None = None) -> tuple[IntArray, IntArray]:
        """The cells of the groups at positions `rows` of `groups_` (those from slot `from_slot` on, when given: a
        day's line reads a seventh of a week's cells): each one's place in `rows`, and its index in the cell arrays."""
        first, end = self.cell_starts_[rows], self.cell_starts_[rows + 1]
        if from_slot is not None:
            first = _first_at_or_after(self.cell_slots_, first, end, np.full(rows.size, from_slot, dtype=np.int64))
        counts = end - first
        place = np.repeat(np.arange(rows.size, dtype=np.int64), counts)
        before = np.cumsum(counts) - counts
        return place, np.repeat(first - before, counts) + np.arange(int(counts.sum()), dtype=np.int64)

    def _dense(self, rows: IntArray) -> FloatArray:
        """The grid's rows of the groups at positions `rows` (-inf where no sample)."""
        grid = np.full((rows.size, self.n_slots_), -np.inf)
        place, cells = self._cells(rows)
        grid[place, self.cell_slots_[cells]] = self.cell_values_[cells]
        return grid

    def _all(self, rows: IntArray | None) -> IntArray:
        return np.arange(len(self.groups_), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)

    def predict(
        self, as_of: float, horizon_seconds: int = SECONDS_PER_DAY, rows: npt.NDArray[np.int64] | None = None
    ) -> FloatArray:
        """The line for every group (or the groups at positions `rows` of `groups_`) over [as_of, as_of + horizon)
        at `step_seconds` steps."""
        check_is_fitted(self, "cell_starts_")
        rows = self._all(rows)
        n_steps = int(np.ceil(horizon_seconds / self.step_seconds))
        if rows.size == 0:
            return np.zeros((0, n_steps))
        blocks = range(0, rows.size, self.BLOCK_ROWS)
        return np.concatenate([self._predict_block(rows[b : b + self.BLOCK_ROWS], as_of, n_steps) for b in blocks])

    def _predict_block(self, rows: IntArray, as_of: float, n_steps: int) -> FloatArray:
        step = self.step_seconds
        grid = self._dense(rows)
        fallback = self.fallback_[rows]
        half = self.slot_tolerance_seconds // step
        padded = np.pad(grid, ((0, 0), (half, half)), constant_values=-np.inf)
        window_max = sliding_window_view(padded, 2 * half + 1, axis=1).max(axis=2)
        del padded
        seasonal = self._seasonal_max(window_max, as_of + step * np.arange(n_steps, dtype=np.float64))
        recent_slots = (
            as_of
            - self.recent_window_seconds
            + step * np.arange(max(self.recent_window_seconds // step, 1), dtype=np.float64)
        )
        recent = self._observed_max(grid, recent_slots)
        seasonal_recent = self._seasonal_max(window_max, recent_slots).max(axis=1)
        # Fast up: usage above what the same window of past days saw lifts the whole line by the difference.
        comparable = np.isfinite(seasonal_recent) & np.isfinite(recent)
        uplift = np.zeros(rows.size)
        uplift[comparable] = np.maximum(recent[comparable] - seasonal_recent[comparable], 0.0)
        line = np.where(np.isfinite(seasonal), seasonal + uplift[:, None], recent[:, None])
        first_window = np.arange(n_steps) * step < self.recent_window_seconds
        line[:, first_window] = np.fmax(line[:, first_window], recent[:, None])
        line = np.where(np.isfinite(line), line, fallback[:, None])
        result: FloatArray = np.nan_to_num(line, nan=0.0)
        return result

    def _slots(self, times: FloatArray) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        slots = np.floor((times - self.grid_origin_) / self.step_seconds).astype(np.int64)
        return slots, (slots >= 0) & (slots < self.n_slots_)

    def _seasonal_max(self, window_max: FloatArray, times: FloatArray) -> FloatArray:
        """Per group and time: max over the past `seasonal_days` days of the tolerance window at that time of day."""
        seasonal = np.full((window_max.shape[0], times.size), -np.inf)
        for day in range(1, self.seasonal_days + 1):
            slots, inside = self._slots(times - day * SECONDS_PER_DAY)
            seasonal[:, inside] = np.maximum(seasonal[:, inside], window_max[:, slots[inside]])
        return seasonal

    def _observed_max(self, grid: FloatArray, times: FloatArray) -> FloatArray:
        """Per group (rows of `grid`, dense): the max of the observed slots at these times (-inf where none)."""
        slots, inside = self._slots(times)
        if not inside.any():
            return np.full(grid.shape[0], -np.inf)
        observed: FloatArray = grid[:, slots[inside]].max(axis=1)
        return observed

    def observed_max(self, times: FloatArray, rows: npt.NDArray[np.int64]) -> FloatArray:
        """Per group at positions `rows` of `groups_`: the max of its observed steps at these times (-inf where
        none, or where they lie outside the kept week)."""
        check_is_fitted(self, "cell_starts_")
        rows = self._all(rows)
        slots, inside = self._slots(times)
        wanted = np.zeros(self.n_slots_, dtype=bool)
        wanted[slots[inside]] = True
        place, cells = self._cells(rows)
        chosen = wanted[self.cell_slots_[cells]]
        observed = np.full(rows.size, -np.inf)
        np.maximum.at(observed, place[chosen], self.cell_values_[cells[chosen]])
        return observed

    def recent(self, as_of: float, window_seconds: int, rows: npt.NDArray[np.int64] | None = None) -> FloatArray:
        """Observed line (max over pods per step) for [as_of - window, as_of) of every group (or those at positions
        `rows`); NaN where there was no sample. Each step shows the grid's slot holding its last second, so the
        newest samples (in the slot `as_of` falls in, when it is not on the grid) are shown: a burst in the last
        minutes is what a line just issued answers."""
        check_is_fitted(self, "cell_starts_")
        rows = self._all(rows)
        step = self.step_seconds
        n_steps = int(np.ceil(window_seconds / step))
        slots, inside = self._slots(as_of - window_seconds - 1.0 + step * np.arange(1, n_steps + 1, dtype=np.float64))
        column = np.full(self.n_slots_, -1, dtype=np.int64)
        column[slots[inside]] = np.flatnonzero(inside)
        place, cells = self._cells(rows, from_slot=int(slots[inside].min()) if inside.any() else self.n_slots_)
        at = column[self.cell_slots_[cells]]
        shown = at >= 0
        out = np.full((rows.size, n_steps), np.nan)
        out[place[shown], at[shown]] = self.cell_values_[cells[shown]]
        return out


@dataclass(frozen=True)
class _Cells:
    """Sparse cells: row pointers `starts`, each row's slots sorted, values; a row's cells before `keep_from` (by
    row; None: none) are to drop. Read only: `_merged` writes new arrays."""

    starts: IntArray
    slots: IntArray
    values: FloatArray
    keep_from: IntArray | None = None


def _merged(
    cells: _Cells, shift: int, rows: IntArray, new_slots: IntArray, new_values: FloatArray, n_slots: int
) -> tuple[IntArray, IntArray, FloatArray]:
    """`cells` without their cells to drop, their slots less `shift`, with samples (row, slot, value; slots after
    the shift) maxed in: a sample's cell is found by a binary search within its row, so a pass of one sample per
    group costs that and one copy of the cells kept (`spliced`), not a sort of every cell kept (a week of 5-minute
    slots: 20 million cells at 10,000 groups) nor a boolean mask over them."""
    starts = cells.starts
    keep_from = starts[:-1] if cells.keep_from is None else cells.keep_from
    dropped = keep_from - starts[:-1]
    gone = np.repeat(keep_from - np.cumsum(dropped), dropped) + np.arange(int(dropped.sum()))
    unique, where = np.unique(rows * n_slots + new_slots, return_inverse=True)
    maxima = np.full(unique.size, -np.inf)
    np.maximum.at(maxima, where.reshape(-1), new_values)
    row, slot = unique // n_slots, unique % n_slots + shift
    low = _first_at_or_after(cells.slots, keep_from[row], starts[row + 1], slot)
    found = low < starts[row + 1]
    found[found] = cells.slots[low[found]] == slot[found]
    added = ~found
    slots = spliced(cells.slots, gone, low[added], slot[added])
    if shift:
        slots -= shift
    values = spliced(cells.values, gone, low[added], maxima[added])
    # A cell kept lands where `spliced` put it: less the cells dropped before it, plus the cells inserted up to it.
    at = low[found]
    at = at - np.searchsorted(gone, at) + np.searchsorted(low[added], at, side="right")
    values[at] = np.maximum(values[at], maxima[found])
    counts = np.bincount(row[added], minlength=starts.size - 1) - dropped
    return starts + np.concatenate([[0], np.cumsum(counts)]), slots, values


def _first_at_or_after(slots: IntArray, low: IntArray, high: IntArray, slot: IntArray) -> IntArray:
    """Per search, the first index in [low, high) whose slot is at least `slot` (`high` where none): a binary search
    in each row of sorted `slots`, all rows at once."""
    low, high = low.copy(), high.copy()
    searching = low < high
    while searching.any():
        middle = (low + high) // 2
        before = np.zeros(low.size, dtype=bool)
        before[searching] = slots[middle[searching]] < slot[searching]
        low = np.where(searching & before, middle + 1, low)
        high = np.where(searching & ~before, middle, high)
        searching = low < high
    return low


def peak_of(line: FloatArray, as_of: float, step_seconds: int) -> tuple[FloatArray, FloatArray]:
    """Per group, the highest value of its forecast line and the start (Unix seconds) of the first step that reaches
    it, NaN where the line has no time of maximum within the horizon: it is highest already at its first step (which
    starts at the decision time itself), or it stays at its highest from there to the horizon's end (flat, a step up
    to a flat level, or still rising), where no one time stands out."""
    if line.shape[1] == 0:
        raise ValueError("a peak needs at least one forecast step")
    at = np.argmax(line, axis=1)
    highest = line[np.arange(line.shape[0]), at]
    after = np.arange(line.shape[1])[None, :] > at[:, None]
    falls = ((line < highest[:, None]) & after).any(axis=1)
    times: FloatArray = np.where((at > 0) & falls, as_of + at * step_seconds, np.nan)
    return highest, times
