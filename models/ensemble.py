"""Fleet-level model selection and hierarchical calibration over the forecasters of `models.forecast`.

Why not per container: choosing each container's own cheapest candidate on its own last days (the first design)
fitted those days and did not carry over to the next ones or to other containers (issue 19). Here the fleet chooses.
A rolling-origin backtest (the last `selection_days` days, each forecast from data before that day only) scores
every candidate, built for the asked risk level, by what the product is judged on: the overprovision once the
candidate's lines are scaled so that exactly `target_violation` of the fleet's samples lie above them
(`matched_costs`). The fleet takes its cheapest candidate; a group of similar containers (by burstiness, the ratio
of a high to a middle quantile of its usage) takes its own only when that is cheaper on the group by at least
`group_min_gain` and the group holds `group_min_containers`: a choice needs evidence from many containers; and it
keeps it only when that makes the fleet's pooled matched cost at most `group_min_gain` higher (`keep_pooled_gains`),
since the fleet is calibrated and judged as one. The baselines' own flat rules (`flat_rules`) are candidates and
fallbacks: a choice stands only if, made on the earlier origins, it also beat the best of them on the last
`validation_days` origins it did not see, and a fleet under `selection_min_containers` takes the best of them
(`SelectedForecaster._validated`).

Calibration is hierarchical and conformal: a container's factor (the (1 - target) quantile of usage / line on the
out-of-sample days) is shrunk toward its group's, and the group's toward the fleet's, each with weight
n / (n + prior) for the n samples behind it. Containers whose own factor lies outside the factor guard (their lines
are off by more than 4x: broken or poisoned data) are left out of the pooled factors (`calibration_outliers`), so a
few of them cannot move the others'. The steps are pure functions so the backtest can run them on lines it has
already computed; `SelectedForecaster` wires them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, clone
from sklearn.utils.validation import check_is_fitted

from models.forecast import (
    STEPS_PER_DAY,
    DecayedPeakForecaster,
    DecayedQuantileForecaster,
    FlatQuantileForecaster,
    GridOrder,
    MultiWindowQuantileForecaster,
    StlForecaster,
    WindowQuantileForecaster,
    check_grid,
    fit_together,
    nan_quantile,
    nan_quantiles,
)
from models.vpa import VpaRecommender
from recommender.arrays import FloatArray, IntArray, UInt64Array
from recommender.colocation import KOORDINATOR_MID_HALF_LIFE_SECONDS, KOORDINATOR_MID_QUANTILE
from recommender.settings import ForecastSettings

#: Candidates whose line is one value over the horizon: backtested as one value per origin and container.
CONSTANT_FORECASTERS = (
    FlatQuantileForecaster,
    DecayedQuantileForecaster,
    MultiWindowQuantileForecaster,
    DecayedPeakForecaster,
)


#: Values (origins x containers x steps) in one block of containers of the selection's passes (16 MB a temporary):
#: choosing and calibrating hold a block at a time, so their memory follows the block, not the fleet.
SELECTION_BLOCK_VALUES = 2_000_000
#: Ratios of a tail (`SortedSegments.tail_quantile`) read at once: with their index temporaries (some 60 bytes a
#: ratio) a block stays near 120 MB however long the tail. (500,000 cost 16 % more CPU at 4,000 containers.)
TAIL_BLOCK_VALUES = 2_000_000


class SortedChunks:
    """A grid's chunks (chunks x containers x steps, each container's sorted, NaN last), their known `counts`
    (chunks x containers) and, per chunk from the first origin on, its `place` in `values` (-1: no known value);
    with each segment's cumulative sums (`cumulative`) computed once for every line scored on them."""

    def __init__(self, values: FloatArray, counts: IntArray, place: IntArray) -> None:
        self.values, self.counts, self.place = values, counts, place
        self._cumulative: FloatArray | None = None

    def cumulative(self) -> FloatArray:
        """(chunks x containers) x (steps + 1): each segment's sums of its first 0, 1, ... values (NaN as 0)."""
        if self._cumulative is None:
            flat = self.values.reshape(-1, self.values.shape[-1])
            self._cumulative = np.zeros((flat.shape[0], flat.shape[1] + 1))
            np.nancumsum(flat, axis=1, out=self._cumulative[:, 1:])
        return self._cumulative


def sort_chunks(parts: Sequence[FutureUsage]) -> SortedChunks:
    """The chunks of `spacing` steps from the first origin on of the parts' grids (the same origins and width;
    containers in part order), each container's sorted (NaN last), those without a known value in any part left
    out: written into one array part by part, so no part's copy outlives its sort."""
    first = parts[0]
    width, start = first.spacing, first.origins[0]
    count = len(first.origins) - 1 + first.steps // width
    inside = [j for j in range(count) if start + j * width < first.grid.shape[1]]
    n_containers = sum(part.shape[1] for part in parts)
    values = np.empty((len(inside), n_containers, width))
    column = 0
    for part in parts:
        rows = slice(column, column + part.shape[1])
        for k, j in enumerate(inside):
            chunk = part.cut(start + j * width, start + (j + 1) * width)
            values[k, rows, : chunk.shape[1]] = np.sort(chunk, axis=1)
            values[k, rows, chunk.shape[1] :] = np.nan
        column = rows.stop
    counts = np.sum(~np.isnan(values), axis=2)
    kept = counts.any(axis=1)
    if not kept.all():
        values, counts = values[kept], counts[kept]
    place = np.full(count, -1, dtype=np.int64)
    place[np.asarray(inside, dtype=np.int64)[kept]] = np.arange(int(kept.sum()))
    return SortedChunks(values, counts, place)


class FutureUsage:
    """The usage after each origin (`usage_after`: origins x containers x steps), cut from the grid a block of
    containers at a time instead of held whole (a week after 7 origins is 14,112 values a container, 113 MB at 1,000
    containers), NaN past the grid's end. `rows`: the grid's rows that are the containers (all by default): a
    partition's grid is read as it is, never copied whole for the selection."""

    def __init__(
        self,
        grid: FloatArray,
        origins: list[int],
        steps: int,
        chunks: dict[int, SortedChunks] | None = None,
        rows: IntArray | None = None,
    ) -> None:
        self.grid = grid
        self.origins = origins
        self.steps = steps
        self.select = rows
        self.shape = (len(origins), grid.shape[0] if rows is None else rows.size, steps)
        spacing = set(np.diff(origins).tolist())
        #: Steps between origins (the usage's width for a single origin).
        self.spacing = int(next(iter(spacing))) if len(spacing) == 1 else steps
        self.even = len(spacing) <= 1 and bool(origins) and origins[0] >= 0
        # The sorted chunks of the grid (`sorted_chunks`), shared with the `first` of this usage.
        self._chunks: dict[int, SortedChunks] = {} if chunks is None else chunks

    def rows(self, rows: slice) -> FloatArray:
        picked = self.grid[rows] if self.select is None else self.grid[self.select[rows]]
        return usage_after(picked, self.origins, self.steps)

    def cut(self, start: int, stop: int) -> FloatArray:
        """Columns [start, stop) of the containers' rows (a copy when `rows` picks them)."""
        return self.grid[:, start:stop] if self.select is None else self.grid[self.select, start:stop]

    def first(self, steps: int) -> FutureUsage:
        """The same origins' usage over their first `steps` only."""
        return FutureUsage(self.grid, self.origins, min(steps, self.steps), self._chunks, self.select)

    def chunked(self) -> bool:
        """Whether every origin's usage is whole chunks of `spacing` steps of the grid (evenly spaced origins): the
        origins then share their chunks, each sorted once (`sorted_chunks`)."""
        return self.even and self.spacing > 0 and self.steps % self.spacing == 0

    def sorted_chunks(self) -> SortedChunks:
        """`sort_chunks` of this usage, computed once for it and every `first` of it."""
        if self.spacing not in self._chunks:
            self._chunks[self.spacing] = sort_chunks([self])
        return self._chunks[self.spacing]


class FleetUsage:
    """The past usage of several partitions' containers as one fleet's (containers in partition order; a block of
    the selection never spans two), so that the fleet's choice is made over partitions as over blocks of one."""

    def __init__(
        self, parts: Sequence[FloatArray | FutureUsage], chunks: dict[int, SortedChunks] | None = None
    ) -> None:
        self.parts = list(parts)
        self.starts = np.cumsum([0] + [part.shape[1] for part in self.parts])
        self.shape = (self.parts[0].shape[0], int(self.starts[-1]), self.parts[0].shape[2])
        self._chunks: dict[int, SortedChunks] = {} if chunks is None else chunks

    def part_rows(self) -> list[slice]:
        """Each partition's containers among the fleet's."""
        return [slice(int(a), int(b)) for a, b in zip(self.starts[:-1], self.starts[1:])]

    def rows(self, rows: slice) -> FloatArray:
        part = int(np.searchsorted(self.starts, rows.start, side="right")) - 1
        offset = int(self.starts[part])
        return usage_rows(self.parts[part], slice(rows.start - offset, rows.stop - offset))

    def first(self, steps: int) -> FleetUsage:
        return FleetUsage(
            [p.first(steps) if isinstance(p, FutureUsage) else p[:, :, :steps] for p in self.parts], self._chunks
        )

    def future_parts(self) -> list[FutureUsage] | None:
        """The parts, when each is a chunked `FutureUsage` of the same origins and steps (else None)."""
        parts = [p for p in self.parts if isinstance(p, FutureUsage) and p.chunked()]
        first = parts[0] if parts else None
        if first is None or len(parts) < len(self.parts):
            return None
        if any(
            p.origins != first.origins or p.steps != first.steps or p.grid.shape[1] != first.grid.shape[1]
            for p in parts
        ):
            return None
        return parts

    def chunked(self) -> bool:
        return self.future_parts() is not None

    def sorted_chunks(self) -> SortedChunks:
        """`sort_chunks` of every part as one fleet's, computed once for this usage and every `first` of it."""
        parts = self.future_parts()
        assert parts is not None
        if parts[0].spacing not in self._chunks:
            self._chunks[parts[0].spacing] = sort_chunks(parts)
        return self._chunks[parts[0].spacing]


#: Past usage as the selection reads it: an (origins x containers x steps) array, its lazy `FutureUsage`, or a
#: `FleetUsage` of partitions.
PastUsage = FloatArray | FutureUsage | FleetUsage


def usage_rows(usage: PastUsage, rows: slice, ordered: bool = False) -> FloatArray:
    """The past usage of the containers `rows` (origins x rows x steps), possibly a strided view; `ordered`: C-ordered,
    for sums over it (a sum adds in memory order, so it is then the same whether the usage was cut or viewed)."""
    block = usage.rows(rows) if isinstance(usage, FutureUsage | FleetUsage) else usage[:, rows]
    return np.ascontiguousarray(block) if ordered else block


def container_blocks(usage: PastUsage) -> list[slice]:
    """Consecutive blocks of containers of at most `SELECTION_BLOCK_VALUES` values of past usage each (within one
    partition of a `FleetUsage`)."""
    if isinstance(usage, FleetUsage):
        return [
            slice(rows.start + int(start), rows.stop + int(start))
            for part, start in zip(usage.parts, usage.starts)
            for rows in container_blocks(part)
        ]
    n_origins, n_containers, steps = usage.shape
    size = max(1, SELECTION_BLOCK_VALUES // max(n_origins * steps, 1))
    return [slice(first, min(first + size, n_containers)) for first in range(0, n_containers, size)]


class SortedSegments:
    """The past usage of every origin and container as sorted segments, for scoring constant lines without a pass
    over every sample: a constant line's usage / line ratios of a segment are its sorted usage divided by one level,
    so they are sorted too, and a quantile or a count above a level only reads their top.

    `values` (segments x width, each sorted, NaN last) and their known `counts`; `origin`, `container` and `segment`
    list the segments of each (origin, container) row of the usage, rows without a known value left out. With
    evenly spaced origins the segments are the grid's chunks between origins (a day), each sorted once for every
    origin whose usage holds it (the long-term line's week after 7 origins is 28 days' chunks of 7 sorted days)."""

    def __init__(self, usage: PastUsage) -> None:
        chunked = isinstance(usage, FutureUsage | FleetUsage) and usage.chunked()
        parts = [usage] if chunked or not isinstance(usage, FleetUsage) else usage.parts
        firsts = np.cumsum([0] + [part.shape[1] for part in parts])
        values, counts, rows = [], [], []
        self.chunks: SortedChunks | None = None
        base = 0
        for part, first in zip(parts, firsts):
            n_origins, n_containers, steps = part.shape
            containers = np.arange(n_containers, dtype=np.int64)
            if chunked and isinstance(part, FutureUsage | FleetUsage):
                self.chunks = chunks = part.sorted_chunks()
                width = chunks.values.shape[2]
                for o in range(n_origins):
                    for j in chunks.place[o : o + steps // width]:
                        if j >= 0:
                            rows.append((o, first + containers, base + j * n_containers + containers))
                values.append(chunks.values.reshape(-1, width))
                counts.append(chunks.counts.ravel())
            else:
                ordered = np.sort(usage_rows(part, slice(0, n_containers)), axis=2)
                values.append(ordered.reshape(-1, steps))
                counts.append(np.sum(~np.isnan(ordered), axis=2).ravel())
                for o in range(n_origins):
                    rows.append((o, first + containers, base + o * n_containers + containers))
            base += values[-1].shape[0]
        self.values: FloatArray = values[0] if len(values) == 1 else np.concatenate(values)
        self.counts: IntArray = (counts[0] if len(counts) == 1 else np.concatenate(counts)).astype(np.int64)
        empty = np.empty(0, dtype=np.int64)
        origin = np.concatenate([np.full(c.size, o, dtype=np.int64) for o, c, _ in rows]) if rows else empty
        container = np.concatenate([c for _, c, _ in rows]) if rows else empty
        segment = np.concatenate([s for _, _, s in rows]) if rows else empty
        known = self.counts[segment] > 0
        self.origin, self.container, self.segment = origin[known], container[known], segment[known]
        self.n_containers = int(firsts[-1])

    def ratios(self, levels: FloatArray, which: IntArray, position: IntArray) -> FloatArray:
        """`scored_ratios` of the usage at `position` of segments `which` (indices into `segment`) against the
        levels of their rows (`levels`, per segment: the same length as `which`, or broadcast onto `position`)."""
        return scored_ratios(levels, self.usage(which, position))

    def tail_quantile(
        self, levels: FloatArray, known: IntArray, which: IntArray, q: float
    ) -> tuple[float, int, IntArray]:
        """The q-quantile by the "higher" rule of the ratios of the segments `which` (levels per segment of
        `segment`, `known`: the ratios each has), their count, and per segment of `which` its ratios above it.

        The quantile is the m-th largest ratio; the m-th largest of each segment's top h (enough for m in all)
        bounds it from below, so only the ratios above that bound are read: a segment whose whole top lies above
        it is searched for where its ratios cross it. Where they are many, they are read a block at a time
        (`_tail_rank`), not held at once."""
        counts = known[which]
        total = int(counts.sum())
        if total == 0:
            return float("nan"), 0, np.zeros(which.size, dtype=np.int64)
        rank = min(max(int(np.ceil(q * total)) - 1, 0), total - 1)
        m = total - rank
        level = levels[which]
        depth = int(min(self.values.shape[1], max(1, -(-2 * m // which.size))))
        position = counts[:, None] - depth + np.arange(depth)[None, :]
        present = position >= 0
        top = self.ratios(level[:, None], which[:, None], np.maximum(position, 0))
        floor = -np.inf
        if int(present.sum()) >= m:
            shown = top[present]
            floor = float(np.partition(shown, shown.size - m)[shown.size - m])
        # The ratios above the bound: at least m are at or above it, so when fewer than m are above it, it is the
        # quantile (equal ratios at the bound, flat usage against a flat line, are then never read).
        above = np.sum(present & (top > floor), axis=1)
        start = counts - above
        deeper = np.flatnonzero((above == depth) & (counts > depth))
        if deeper.size:
            low, kept = level[deeper], which[deeper]
            start[deeper] = self.first(kept, counts[deeper] - depth, lambda at: self.ratios(low, kept, at) > floor)
        lengths = counts - start
        if int(lengths.sum()) < m:
            return floor, total, lengths.astype(np.int64)
        if int(lengths.sum()) <= TAIL_BLOCK_VALUES:
            owner, values = self._tail(level, which, start, lengths)
            quantile = float(np.partition(values, values.size - m)[values.size - m])
            return quantile, total, np.bincount(owner, weights=values > quantile, minlength=which.size).astype(np.int64)
        quantile = self._tail_rank(level, which, start, lengths, m)
        reading = np.flatnonzero(lengths > 0)
        first_above = self.first(
            which[reading], counts[reading], lambda at: self.ratios(level[reading], which[reading], at) > quantile
        )
        result = np.zeros(which.size, dtype=np.int64)
        result[reading] = counts[reading] - first_above
        return quantile, total, result

    def _tail(
        self, level: FloatArray, which: IntArray, start: IntArray, lengths: IntArray
    ) -> tuple[IntArray, FloatArray]:
        """The ratios from `start` on of the segments `which` (`lengths` of them each) and the segment of each."""
        owner = np.repeat(np.arange(which.size), lengths)
        offsets = np.arange(owner.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        return owner, self.ratios(level[owner], which[owner], start[owner] + offsets)

    def _tail_rank(self, level: FloatArray, which: IntArray, start: IntArray, lengths: IntArray, m: int) -> float:
        """The m-th largest of the ratios `_tail` reads, holding a block of `TAIL_BLOCK_VALUES` of them at a
        time: counts in bins ordered as the floats are (`_order_bins`), then only the values of the bin that holds
        the rank."""
        ends = np.cumsum(lengths)
        cuts = np.searchsorted(ends, np.arange(TAIL_BLOCK_VALUES, int(ends[-1]), TAIL_BLOCK_VALUES))
        pieces = [slice(int(a), int(b)) for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), which.size]) if b > a]

        def blocks() -> Iterator[FloatArray]:
            for piece in pieces:
                yield self._tail(level[piece], which[piece], start[piece], lengths[piece])[1]

        counts = np.zeros(_BIN_COUNT, dtype=np.int64)
        for values in blocks():
            counts += np.bincount(_order_bins(values), minlength=_BIN_COUNT)
        from_top = np.cumsum(counts[::-1])
        bin_of_rank = _BIN_COUNT - 1 - int(np.searchsorted(from_top, m))
        higher = int(from_top[_BIN_COUNT - 2 - bin_of_rank]) if bin_of_rank < _BIN_COUNT - 1 else 0
        # A segment's ratios are sorted, so its values in that bin are a run of it, found by search, not a pass.
        ends = start + lengths

        def bin_at(at: IntArray) -> IntArray:
            return _order_bins(self.ratios(level, which, np.minimum(at, np.maximum(ends - 1, 0))))

        low = self.first(which, ends, lambda at: bin_at(at) >= bin_of_rank)
        high = self.first(which, ends, lambda at: bin_at(at) > bin_of_rank)
        low, high = np.maximum(low, start), np.maximum(high, start)
        inside = self._tail(level, which, low, high - low)[1]
        return float(np.partition(inside, inside.size - (m - higher))[inside.size - (m - higher)])

    def labelled_tails(
        self, levels: FloatArray, labels: IntArray, n_labels: int, q: float
    ) -> list[tuple[float, int, IntArray, IntArray]]:
        """`tail_quantile` of the ratios against a constant line (`levels`: origins x containers) of each label's
        containers (`labels`: one per container, -1 for none) and, last, of every labelled one, with the segments
        (indices into `segment`) whose ratios above it `tail_quantile` counts."""
        level = levels[self.origin, self.container]
        known = np.where(np.isnan(level), 0, self.counts[self.segment])
        label = labels[self.container]
        tails: list[tuple[float, int, IntArray, IntArray]] = []
        for i in range(n_labels + 1):
            if i == n_labels == 1:  # one label: the union is its containers, so its tail too
                tails.append(tails[0])
                break
            which = np.flatnonzero(((label == i) if i < n_labels else (label >= 0)) & (known > 0))
            quantile, total, above = self.tail_quantile(level, known, which, q)
            tails.append((quantile, total, which, above))
        return tails

    def first(self, which: IntArray, limit: IntArray, reached: Callable[[IntArray], npt.NDArray[np.bool_]]) -> IntArray:
        """Per segment of `which`, the first position below `limit` where `reached(positions)` holds (`limit` when
        none does; it must hold from some position on, as a comparison with sorted values does): a binary search,
        every segment at once."""
        low, high = np.zeros(which.size, dtype=np.int64), limit.astype(np.int64)
        while (active := low < high).any():
            middle = (low + high) // 2
            hit = reached(np.minimum(middle, np.maximum(limit - 1, 0)))
            high = np.where(active & hit, middle, high)
            low = np.where(active & ~hit, middle + 1, low)
        return low

    def usage(self, which: IntArray, position: IntArray) -> FloatArray:
        """The sorted usage at `position` of the segments `which` (indices into `segment`)."""
        result: FloatArray = self.values.ravel()[self.segment[which] * self.values.shape[1] + position]
        return result

    def pinball_costs(self, levels: FloatArray, q: float) -> FloatArray:
        """Per container the pinball loss at level q of a constant line (`levels`: origins x containers) against
        its usage, summed over its rows (origins) with a known level and usage; NaN without any. From each
        segment's count of usage at or below the level and its cumulative sums (no pass over the samples)."""
        if self.chunks is not None:
            self._cumulative = self.chunks.cumulative()  # shared by every line scored on the chunks
        elif not hasattr(self, "_cumulative"):
            self._cumulative = SortedChunks(self.values, self.counts, np.empty(0, dtype=np.int64)).cumulative()
        every = np.arange(self.segment.size)
        level = levels[self.origin, self.container]
        count = self.counts[self.segment]
        below = self.first(every, count, lambda at: self.usage(every, at) > level)
        at_or_below = self._cumulative[self.segment, below]
        total = self._cumulative[self.segment, count]
        row = self.origin * self.n_containers + self.container
        n_rows = (int(self.origin.max()) + 1 if self.origin.size else 0) * self.n_containers

        def per_row(values: npt.ArrayLike) -> FloatArray:
            summed: FloatArray = np.bincount(row, weights=values, minlength=n_rows).astype(np.float64)
            return summed.reshape(-1, self.n_containers)

        levels_of_rows = np.full(n_rows, np.nan)
        levels_of_rows[row] = level
        row_level = levels_of_rows.reshape(-1, self.n_containers)
        below_rows, at_rows, total_rows, count_rows = (per_row(v) for v in (below, at_or_below, total, count))
        over = (total_rows - at_rows) - row_level * (count_rows - below_rows)
        under = row_level * below_rows - at_rows
        known = ~np.isnan(row_level) & (count_rows > 0)
        pinball = np.where(known, q * over + (1 - q) * under, 0.0).sum(axis=0)
        result: FloatArray = np.where(known.any(axis=0), pinball, np.nan)
        return result


def constant_line_costs(
    segments: SortedSegments, levels: FloatArray, labels: IntArray, n_labels: int, q: float
) -> tuple[FloatArray, IntArray, FloatArray, FloatArray]:
    """What `labelled_costs` reads of a constant candidate's ratios (`levels`: origins x containers), from sorted
    segments: per label and for the union (last) the q-quantile of the ratios and their count, per labelled
    container the samples above its label's quantile and above the union's (2 x containers), and per container the
    sum of its line over its scored samples."""
    level = levels[segments.origin, segments.container]
    known = np.where(np.isnan(level), 0, segments.counts[segments.segment])
    line: FloatArray = np.bincount(
        segments.container, weights=np.where(known > 0, level, 0.0) * known, minlength=segments.n_containers
    ).astype(np.float64)
    alpha, totals = np.full(n_labels + 1, np.nan), np.zeros(n_labels + 1, dtype=np.int64)
    over = np.zeros((2, segments.n_containers))
    for i, (alpha[i], totals[i], which, above) in enumerate(segments.labelled_tails(levels, labels, n_labels, q)):
        if totals[i]:
            over[int(i == n_labels)] += np.bincount(
                segments.container[which], weights=above, minlength=segments.n_containers
            )
    return alpha, totals, over, line


def scored_ratios(lines: FloatArray, usage: FloatArray) -> FloatArray:
    """usage / line per sample as `usage_to_line_ratio` gives it (a line at or below 0: inf above it, else 0), NaN
    where the usage or the line is unknown; `lines` broadcast onto `usage` (a constant line is one step wide)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio: FloatArray = np.divide(usage, lines, order="C")  # C-ordered whatever the usage's layout
    low = lines <= 0  # rare: only those samples are mended
    if low.any():
        low = np.broadcast_to(low, ratio.shape)
        below = usage[low]
        ratio[low] = np.where(below > 0, np.inf, np.where(np.isnan(below), np.nan, 0.0))
    return ratio


def _block_selection_costs(past_lines: Sequence[FloatArray], past_usage: FloatArray, q: float) -> FloatArray:
    """`selection_costs` of lines drawn step by step, on one block of containers (every array holds just those)."""
    scale = np.maximum(np.nansum(past_usage, axis=(0, 2)), 1e-12)
    out = np.full((len(past_lines), past_usage.shape[1]), np.nan)
    for m, lines in enumerate(past_lines):
        line = np.broadcast_to(lines, past_usage.shape)
        known_samples = ~np.isnan(past_usage) & ~np.isnan(line)
        over_part = np.where(known_samples, np.maximum(past_usage - line, 0.0), 0.0)
        under_part = np.where(known_samples, np.maximum(line - past_usage, 0.0), 0.0)
        pinball = (q * over_part + (1 - q) * under_part).sum(axis=(0, 2))
        out[m] = np.where(known_samples.any(axis=(0, 2)), pinball / scale, np.nan)
    return out


def selection_costs(past_lines: Sequence[FloatArray], past_usage: PastUsage, target_violation: float) -> FloatArray:
    """(models x containers) pinball cost of each candidate's past lines (per candidate: origins x containers x
    steps, or x 1 for a constant line) relative to the container's usage: reported per container (how well its line
    did), not used to choose. Constant lines are scored from `SortedSegments` (no samples-sized temporaries)."""
    q = 1.0 - target_violation
    out = np.full((len(past_lines), past_usage.shape[1]), np.nan)
    flat = [m for m, lines in enumerate(past_lines) if lines.shape[2] == 1 and past_usage.shape[2] > 1]
    drawn = [m for m in range(len(past_lines)) if m not in flat]
    scale = np.zeros(past_usage.shape[1])
    for rows in container_blocks(past_usage):
        block = usage_rows(past_usage, rows, ordered=True)
        scale[rows] = np.nansum(block, axis=(0, 2))
        if drawn:
            out[drawn, rows] = _block_selection_costs([past_lines[m][:, rows] for m in drawn], block, q)
    if flat:
        segments = SortedSegments(past_usage)
        for m in flat:
            out[m] = segments.pinball_costs(past_lines[m][:, :, 0], q) / np.maximum(scale, 1e-12)
    return out


def _higher_quantile(values: FloatArray, q: float) -> float:
    """The q-quantile of a 1-D array by the "higher" rule (the smallest value with a q-share at or below it)."""
    rank = min(max(int(np.ceil(q * values.size)) - 1, 0), values.size - 1)
    return float(np.partition(values, rank)[rank])


def selection_rows(rows: list[IntArray], keys: list[UInt64Array], most: int) -> list[IntArray]:
    """Of each partition's `rows`, those the fleet's choice is made on: all of them up to `most` in the fleet (0:
    no limit), else the `most` of the smallest `keys` (per row of each partition's grid; a hash of the container,
    so the same containers in every run and whatever the partitions, and no kind of container favoured)."""
    total = sum(r.size for r in rows)
    if most <= 0 or total <= most:
        return rows
    bound = np.partition(np.concatenate([k[r] for k, r in zip(keys, rows)]), most - 1)[most - 1]
    return [r[k[r] <= bound] for k, r in zip(keys, rows)]


def burstiness(past_usage: PastUsage) -> FloatArray:
    """Per container, the ratio of its past usage's 99th to its 50th percentile (inf when only the 99th is above 0,
    1 when both are 0, NaN without usage)."""
    n_containers = past_usage.shape[1]
    high, middle = np.full(n_containers, np.nan), np.full(n_containers, np.nan)
    for rows in container_blocks(past_usage):
        block = usage_rows(past_usage, rows)
        per_container = np.moveaxis(block, 1, 0).reshape(block.shape[1], -1)
        high[rows], middle[rows] = nan_quantiles(per_container, (0.99, 0.5))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio: FloatArray = np.where(middle > 0, high / middle, np.where(high > 0, np.inf, 1.0))
    return ratio


def burst_edges(ratio: FloatArray, n_groups: int) -> FloatArray:
    """The `burstiness` bounds between `n_groups` groups of equal size (none for one group or no known ratio)."""
    known = ~np.isnan(ratio)
    if n_groups <= 1 or not known.any():
        return np.empty(0)
    edges: FloatArray = np.quantile(np.minimum(ratio[known], 1e12), np.linspace(0, 1, n_groups + 1)[1:-1])
    return edges


def burst_labels(ratio: FloatArray, edges: FloatArray) -> IntArray:
    """Each container's group by its `burstiness` between `edges` (`burst_edges`; an unknown ratio counts as 1)."""
    capped = np.minimum(np.where(np.isnan(ratio), 1.0, ratio), 1e12)
    return np.searchsorted(edges, capped, side="right").astype(np.int64)


#: Bins of `_order_bins`: every negative value in bin 0, then the exponent and first 6 mantissa bits of a positive
#: float64 (2^17 bins, 1.6 % wide).
_BIN_SHIFT = 46
_BIN_COUNT = (1 << (63 - _BIN_SHIFT)) + 1


#: Blocks of ratios a `RatioBlocks` keeps between its passes (16 MB each, as much again for their bins): a fleet of a
#: couple of thousand containers computes its day-ahead ratios once instead of once a pass.
KEPT_BLOCKS = 2


class RatioBlocks:
    """Blocks of (ratios: origins x containers x steps, NaN where unscored) over a fleet, regenerated on each call;
    kept (with their `_order_bins`) when the fleet fits `KEPT_BLOCKS` blocks, so the passes over them share the
    work."""

    def __init__(self, make: Callable[[slice], FloatArray], blocks: list[slice]) -> None:
        self.make = make
        self.blocks = blocks
        self._kept: list[tuple[slice, FloatArray]] | None = None
        self._bins: dict[int, IntArray] = {}

    def __call__(self) -> Iterator[tuple[slice, FloatArray]]:
        if len(self.blocks) > KEPT_BLOCKS:
            return ((rows, self.make(rows)) for rows in self.blocks)
        if self._kept is None:
            self._kept = [(rows, self.make(rows)) for rows in self.blocks]
        return iter(self._kept)

    def bins(self, ratio: FloatArray) -> IntArray:
        """`_order_bins(ratio)` of a block this produced (computed once for a kept block)."""
        for index, (_, kept) in enumerate(self._kept or []):
            if kept is ratio:
                if index not in self._bins:
                    self._bins[index] = _order_bins(ratio)
                return self._bins[index]
        return _order_bins(ratio)


def _order_bins(values: FloatArray) -> IntArray:
    """A bin per float64 (NaN aside) such that a smaller value never lands in a higher bin: the top bits of a
    positive value's bit pattern (which orders as the floats do), bin 0 for every negative one."""
    bins: IntArray = np.ascontiguousarray(values).view(np.int64) >> _BIN_SHIFT
    np.maximum(bins, -1, out=bins)
    bins += 1
    return bins


def labelled_quantiles(blocks: RatioBlocks, labels: IntArray, n_labels: int, q: float) -> tuple[FloatArray, IntArray]:
    """Per label (`labels`: one per container, -1 for none) and for the union of all labels (the last entry), the
    q-quantile by the "higher" rule (`_higher_quantile`) of the known values of those containers over every block,
    and their count (NaN and 0 without any).

    Exact, holding a block at a time: a first pass counts the values per label in bins ordered as the floats are,
    a second keeps only the values of the bin that holds each rank."""
    spill = n_labels * _BIN_COUNT
    counts = np.zeros(spill, dtype=np.int64)
    for rows, ratio in blocks():
        index = blocks.bins(ratio) + (np.maximum(labels[rows], 0) * _BIN_COUNT)[None, :, None]
        index[np.isnan(ratio) | (labels[rows] < 0)[None, :, None]] = spill
        counts += np.bincount(index.ravel(), minlength=spill + 1)[:spill]
    per_label = counts.reshape(n_labels, _BIN_COUNT)
    cumulative = np.cumsum(np.vstack([per_label, per_label.sum(axis=0)]), axis=1)
    totals = cumulative[:, -1].copy()
    ranks = np.minimum(np.maximum(np.ceil(q * totals).astype(np.int64) - 1, 0), np.maximum(totals - 1, 0))
    target = np.array([np.searchsorted(row, rank, side="right") for row, rank in zip(cumulative, ranks)])
    below = np.where(target > 0, cumulative[np.arange(n_labels + 1), np.maximum(target - 1, 0)], 0)
    picked: list[list[FloatArray]] = [[] for _ in range(n_labels + 1)]
    for rows, ratio in blocks():
        mine = labels[rows]
        bins = blocks.bins(ratio)
        known = ~np.isnan(ratio)
        # Each container's own label's bin, then the union's: a value may be kept for both.
        own = known & (bins == np.where(mine >= 0, target[np.maximum(mine, 0)], -1)[None, :, None])
        values, label = ratio[own], np.broadcast_to(mine[None, :, None], ratio.shape)[own]
        for i in np.unique(label):
            picked[int(i)].append(values[label == i])
        picked[n_labels].append(ratio[known & (mine >= 0)[None, :, None] & (bins == target[n_labels])])
    result = np.full(n_labels + 1, np.nan)
    for i in np.flatnonzero(totals > 0):
        values = np.concatenate(picked[i])
        rank = int(ranks[i] - below[i])
        result[i] = np.partition(values, rank)[rank]
    return result, totals


def ratio_blocks(lines: FloatArray, past_usage: PastUsage) -> RatioBlocks:
    """The `scored_ratios` of one candidate's past lines against the past usage, block by block of containers."""
    return RatioBlocks(
        lambda rows: scored_ratios(lines[:, rows], usage_rows(past_usage, rows)), container_blocks(past_usage)
    )


def usage_totals(past_usage: PastUsage, origins: npt.NDArray[np.bool_] | None = None) -> tuple[FloatArray, FloatArray]:
    """Per container, its known samples and their sum over the past usage (origins x containers x steps), a block of
    containers at a time: what every matched cost against this usage divides by (`labelled_costs`). `origins`: the
    origins counted (all by default), for lines drawn at those origins only (`origins_only`)."""
    n_containers = past_usage.shape[1]
    per_container = np.zeros(n_containers)
    used_per_container = np.zeros(n_containers)
    for rows in container_blocks(past_usage):
        block = usage_rows(past_usage, rows, ordered=True)
        if origins is not None:
            block = block[origins]
        known = ~np.isnan(block)
        per_container[rows] = known.sum(axis=(0, 2))
        used_per_container[rows] = np.where(known, block, 0.0).sum(axis=(0, 2))
    return per_container, used_per_container


def labelled_costs(
    past_lines: Sequence[FloatArray],
    past_usage: PastUsage,
    target_violation: float,
    labels: IntArray,
    n_labels: int,
    totals: tuple[FloatArray, FloatArray] | None = None,
) -> FloatArray:
    """((labels + 1) x candidates x 2) `matched_costs` of the containers of each label (`labels`: one per container,
    -1 for none) and, last, of all labelled containers together, a block of containers at a time. `totals`: the
    usage's `usage_totals` where the caller keeps them (`CandidateScores`)."""
    per_container, used_per_container = usage_totals(past_usage) if totals is None else totals
    labelled = labels >= 0

    def per_label(values: FloatArray) -> FloatArray:
        by_label = np.bincount(labels[labelled], weights=values[labelled], minlength=n_labels)
        return np.append(by_label, by_label.sum())

    used, known_total = per_label(used_per_container), per_label(per_container)
    costs = np.full((n_labels + 1, len(past_lines), 2), np.nan)
    q = 1.0 - target_violation
    segments: SortedSegments | None = None
    for m, lines in enumerate(past_lines):
        if sorted_scoring(lines, past_usage, q):
            segments = segments or SortedSegments(past_usage)
            alpha, scored, over, line_per_container = constant_line_costs(segments, lines[:, :, 0], labels, n_labels, q)
        else:
            alpha, scored, over, line_per_container = blocked_line_costs(lines, past_usage, labels, n_labels, q)
        line_sum = per_label(line_per_container)
        for i in range(n_labels + 1):
            if used[i] <= 0 or scored[i] == 0:
                continue
            # Samples the candidate drew no line for count at its mean level, so a gap does not look cheap.
            total_line = float(line_sum[i]) * float(known_total[i]) / float(scored[i])
            members = (labels == i if i < n_labels else labelled) & (per_container > 0)
            rates = over[int(i == n_labels), members] / per_container[members]
            costs[i, m, 0] = alpha[i] * total_line / used[i] - 1.0 if np.isfinite(alpha[i]) else np.inf
            costs[i, m, 1] = float(np.percentile(rates, 90))
    return costs


def sorted_scoring(lines: FloatArray, past_usage: PastUsage, q: float) -> bool:
    """Whether `labelled_costs` scores a candidate's lines from `SortedSegments`: a constant line with finite (or
    unknown) levels, whose samples above the quantile are about a block (the ratios it reads beyond them)."""
    samples = float(np.prod(past_usage.shape))
    return lines.shape[2] == 1 and (1.0 - q) * samples <= SELECTION_BLOCK_VALUES and not np.isinf(lines).any()


def blocked_line_costs(
    lines: FloatArray, past_usage: PastUsage, labels: IntArray, n_labels: int, q: float
) -> tuple[FloatArray, IntArray, FloatArray, FloatArray]:
    """`constant_line_costs` of any candidate's lines (origins x containers x steps, or x 1), from its ratios a
    block of containers at a time."""
    n_containers = past_usage.shape[1]
    labelled = labels >= 0
    blocks = ratio_blocks(lines, past_usage)
    alpha, scored = labelled_quantiles(blocks, labels, n_labels, q)
    over = np.zeros((2, n_containers))  # samples above each container's label's alpha and the union's
    line_per_container = np.zeros(n_containers)
    for rows, ratio in blocks():
        line_per_container[rows] = np.where(np.isnan(ratio), 0.0, lines[:, rows]).sum(axis=(0, 2))
        level = np.where(labelled[rows], alpha[np.maximum(labels[rows], 0)], np.nan)
        over[0, rows] = (ratio > level[None, :, None]).sum(axis=(0, 2))
        over[1, rows] = (ratio > alpha[n_labels]).sum(axis=(0, 2))
    return alpha, scored, over, line_per_container


def matched_costs(
    past_lines: Sequence[FloatArray],
    past_usage: PastUsage,
    target_violation: float,
    members: npt.NDArray[np.bool_] | None = None,
) -> FloatArray:
    """Per candidate (each of past_lines: origins x containers x steps, or x 1 for constant lines):
    (overprovision, p90 container violation) at the pooled violation `target_violation` over the containers in
    `members` (all by default), the harness' '@' figures: alpha x sum(line) / sum(usage) - 1 with alpha the
    (1 - target) quantile of usage / line over every known sample, and the 90th percentile over containers of each
    one's share of samples above alpha x line. NaN where a candidate scored no sample."""
    chosen = np.ones(past_usage.shape[1], dtype=bool) if members is None else members
    costs: FloatArray = labelled_costs(past_lines, past_usage, target_violation, np.where(chosen, 0, -1), 1)[0]
    return costs


def fairness_limit(costs: FloatArray, reference: int, tolerance: float) -> float:
    """The largest p90 container violation a fair line may have: the `reference` candidate's plus `tolerance`
    (none where the reference has no figure)."""
    return float(costs[reference, 1] + tolerance) if np.isfinite(costs[reference, 1]) else float("inf")


def cheapest_fair(costs: FloatArray, reference: int, tolerance: float, min_gain: float = 0.0) -> int:
    """Index of the lowest overprovision (costs: candidates x (overprovision, p90 container violation)) among the
    candidates whose p90 container violation is at most the `reference` candidate's plus `tolerance` x the target
    violation: cheaper lines must not get there by giving up on some containers (a flat line spreads its misses
    evenly; a time-of-day line may miss a little more on some containers for far less room). The `reference` stays
    unless that candidate is cheaper by more than `min_gain` of the reference's overprovision: candidates within a
    few per cent of each other are a tie that a few containers joining or leaving the fleet break either way, while
    their lines for one container may differ 10x (a 1-day and a 14-day max), so a tie goes to the default."""
    over = np.where(np.isnan(costs[:, 0]), np.inf, costs[:, 0])
    fair = np.isfinite(over) & ~(costs[:, 1] > fairness_limit(costs, reference, tolerance))
    best = int(np.argmin(np.where(fair, over, np.inf))) if fair.any() else int(np.argmin(over))
    if np.isfinite(over[reference]) and not over[best] < (1.0 - min_gain) * over[reference]:
        return reference
    return best


def cheapest_fallback(
    costs: FloatArray, fallbacks: Sequence[int], reference: int, tolerance: float, min_gain: float = 0.0
) -> int:
    """`cheapest_fair` among the `fallbacks` (the baselines' flat rules; every candidate when there are none) and the
    `reference`, the default they must beat by `min_gain`."""
    if not fallbacks:
        return cheapest_fair(costs, reference, tolerance, min_gain)
    allowed = [*fallbacks, reference]
    restricted = np.full(costs.shape, np.nan)
    restricted[allowed, 0] = costs[allowed, 0]
    restricted[:, 1] = costs[:, 1]
    return cheapest_fair(restricted, reference, tolerance, min_gain)


def origins_only(past_lines: Sequence[FloatArray], kept: npt.NDArray[np.bool_]) -> list[FloatArray]:
    """The past lines with the origins outside `kept` unknown (NaN): scored as lines never drawn, so a cost of them
    reads only the `kept` origins' usage (with `usage_totals(..., kept)`)."""
    return [np.where(kept[:, None, None], lines, np.nan) for lines in past_lines]


def choose_models(
    costs: FloatArray,
    groups: IntArray,
    target_violation: float,
    min_gain: float,
    min_containers: int,
    reference: int = 0,
    fairness_tolerance: float = 1.0,
    pooled_cost: Callable[[IntArray], FloatArray] | None = None,
    choice_min_gain: float = 0.0,
) -> tuple[IntArray, FloatArray, FloatArray]:
    """Candidate index per container (its group's choice where the group's evidence is strong, else the fleet's)
    from the `labelled_costs` of the candidates by `groups` ((groups + 1) x candidates x 2), the fleet's matched
    costs (candidates x 2, see `matched_costs`) and the groups' (groups x candidates x 2). With `pooled_cost` (the
    fleet's cost of a choice per container, `pooled_choice_cost`), a group keeps its own choice only where the fleet
    does not pay for it (`keep_pooled_gains`, with `min_gain` as the loss allowed). A candidate replaces the
    `reference` only when cheaper by more than `choice_min_gain` (`cheapest_fair`)."""
    n_groups = costs.shape[0] - 1
    fleet, per_group = costs[n_groups], costs[:n_groups].copy()
    # A group chooses on its own only when it holds enough containers to be evidence.
    eligible = np.bincount(groups, minlength=n_groups) >= max(min_containers, 1)
    per_group[~eligible] = np.nan
    tolerance = fairness_tolerance * target_violation
    fleet_choice = cheapest_fair(fleet, reference, tolerance, choice_min_gain)
    choice = np.full(groups.size, fleet_choice, dtype=np.int64)
    for g in np.flatnonzero(eligible):
        best = cheapest_fair(per_group[g], reference, tolerance, choice_min_gain)
        if (
            np.isfinite(per_group[g, best, 0])
            and per_group[g, best, 0] < (1.0 - min_gain) * per_group[g, fleet_choice, 0]
        ):
            choice[groups == g] = best
    if pooled_cost is not None:
        limit = fairness_limit(fleet, reference, tolerance)
        choice = keep_pooled_gains(choice, groups, fleet_choice, fleet[fleet_choice], pooled_cost, min_gain, limit)
    return choice, fleet, per_group


def keep_pooled_gains(
    choice: IntArray,
    groups: IntArray,
    fleet_choice: int,
    fleet_cost: FloatArray,
    pooled_cost: Callable[[IntArray], FloatArray],
    max_loss: float,
    p90_limit: float,
) -> IntArray:
    """`choice` with each group that chose on its own put back on the fleet's candidate where its own choice makes
    the fleet's pooled matched cost more than `max_loss` higher, unless putting it back takes the fleet's p90
    container violation past `p90_limit` (the fairness limit of `cheapest_fair`). `pooled_cost` gives the
    (overprovision, p90 container violation) of a choice per container; `fleet_cost` is that of every container on
    `fleet_choice`.

    A group chooses by its own matched cost, but the lines are calibrated and judged as one fleet, at one pooled
    risk level: a bursty group's max-shaped line is cheap for that group at its level and dear for the fleet at
    its (measured on the development split at 5 %: 12 % more CPU and memory overprovision). Groups are tried in
    order."""
    current = choice.copy()
    own_groups = [g for g in np.unique(groups[groups >= 0]) if np.any(current[groups == g] != fleet_choice)]
    if not own_groups:
        return current
    cost = pooled_cost(current)
    for g in own_groups:
        back = current.copy()
        back[groups == g] = fleet_choice
        without = fleet_cost if np.all(back == fleet_choice) else pooled_cost(back)
        if cost[0] > (1.0 + max_loss) * without[0] and not without[1] > p90_limit:
            current, cost = back, without
    return current


def pooled_choice_cost(
    past_lines: Sequence[FloatArray] | Mapping[int, FloatArray],
    choice: IntArray,
    past_usage: PastUsage,
    target_violation: float,
    groups: IntArray,
    totals: tuple[FloatArray, FloatArray] | None = None,
) -> FloatArray:
    """The fleet's (matched overprovision, p90 container violation) (`labelled_costs`) of the lines of `choice` (a
    candidate per container) over the containers with a group, as the fleet's cost of one candidate counts them."""
    labels = np.where(groups >= 0, 0, -1)
    lines = pick_lines(past_lines, choice, axis=1)
    costs: FloatArray = labelled_costs([lines], past_usage, target_violation, labels, 1, totals)[1, 0]
    return costs


class CandidateScores:
    """Candidates' scores against one past usage, each computed once: the lines that share candidates and usage
    (the short-term and request lines at one risk level both score every constant candidate against the same day)
    read them the second time from here. Keyed by candidate name and level: one instance serves one past usage."""

    def __init__(self) -> None:
        self._groups: dict[int, IntArray] = {}
        self._burstiness: FloatArray | None = None
        self._scores: dict[tuple[str, str, float], FloatArray] = {}
        self._totals: tuple[FloatArray, FloatArray] | None = None

    def groups(self, past_usage: PastUsage, n_groups: int) -> IntArray:
        """Group index (0 = steadiest) per container of the usage (origins x containers x steps): quantile bins of
        its `burstiness`, so that bursty and steady containers may choose apart."""
        if n_groups <= 1:  # one group: no burstiness to compute (a week of samples a container for the long-term line)
            return np.zeros(past_usage.shape[1], dtype=np.int64)
        if n_groups not in self._groups:
            self._groups[n_groups] = burst_labels(self.burstiness(past_usage), self.edges(past_usage, n_groups))
        return self._groups[n_groups]

    def edges(self, past_usage: PastUsage, n_groups: int) -> FloatArray:
        """`burst_edges` of the usage: what places a container decided elsewhere in these groups."""
        return burst_edges(self.burstiness(past_usage), n_groups)

    def burstiness(self, past_usage: PastUsage) -> FloatArray:
        """`burstiness` of the usage."""
        if self._burstiness is None:
            self._burstiness = burstiness(past_usage)
        return self._burstiness

    def totals(self, past_usage: PastUsage) -> tuple[FloatArray, FloatArray]:
        """`usage_totals` of the usage."""
        if self._totals is None:
            self._totals = usage_totals(past_usage)
        return self._totals

    def per_candidate(
        self,
        kind: str,
        names: Sequence[str],
        past_lines: Sequence[FloatArray],
        target_violation: float,
        axis: int,
        score: Callable[[list[FloatArray]], FloatArray],
    ) -> FloatArray:
        """`score` of the candidates' past lines (the candidates along `axis` of its result), computed only for the
        candidates not yet scored as `kind` at this level: a score of one candidate never depends on the others."""
        missing = [m for m, name in enumerate(names) if (kind, name, target_violation) not in self._scores]
        if missing:
            fresh = score([past_lines[m] for m in missing])
            for i, m in enumerate(missing):
                self._scores[(kind, names[m], target_violation)] = np.take(fresh, i, axis=axis)
        return np.stack([self._scores[(kind, name, target_violation)] for name in names], axis=axis)


#: Relative width of the log-spaced bins of the calibration sketch: the fleet factor is exact to this share.
SKETCH_RESOLUTION = 1e-4
_LOG_STEP = float(np.log1p(SKETCH_RESOLUTION))
_ZERO_BIN = np.iinfo(np.int64).min
#: The widest range of bins `ratio_sketch` counts in an array (8 MB) instead of sorting its ratios' bins.
SKETCH_COUNTED_BINS = 1 << 20
_INF_BIN = np.iinfo(np.int64).max


def ratio_sketch(ratios: FloatArray) -> tuple[IntArray, IntArray]:
    """Sparse counts (bins, counts) of the known ratios over log bins of relative width `SKETCH_RESOLUTION`.

    Sketches of disjoint sets of containers add up exactly (`merge_sketches`), so a fleet's calibration quantile
    comes out the same whether the containers were fitted in one process or in partitions on many.
    """
    values = ratios[~np.isnan(ratios)]
    positive = np.isfinite(values) & (values > 0)
    bins = np.floor(np.log(values[positive]) / _LOG_STEP).astype(np.int64)
    infinite = np.isinf(values)
    zero, inf = int(np.sum(~positive & ~infinite)), int(np.sum(infinite))
    if bins.size and int(bins.max()) - int(bins.min()) <= SKETCH_COUNTED_BINS:
        # Counted over the bins' range rather than sorted: a block's ratios span far fewer bins than they number.
        low = int(bins.min())
        per_bin = np.bincount(bins - low)
        unique, counts = np.flatnonzero(per_bin) + low, per_bin[per_bin > 0]
    else:
        unique, counts = np.unique(bins, return_counts=True)
    # The zero bin sorts first and the infinite one last, as their codes do.
    ends = [(code, n) for code, n in ((_ZERO_BIN, zero), (_INF_BIN, inf)) if n]
    codes = np.array([c for c, _ in ends], dtype=np.int64)
    sizes = np.array([n for _, n in ends], dtype=np.int64)
    first = int(bool(zero))
    return (
        np.concatenate([codes[:first], unique.astype(np.int64), codes[first:]]),
        np.concatenate([sizes[:first], counts.astype(np.int64), sizes[first:]]),
    )


def merge_sketches(sketches: list[tuple[IntArray, IntArray]]) -> tuple[IntArray, IntArray]:
    """One sketch of the union of the sketched sets."""
    if not sketches:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    bins = np.concatenate([b for b, _ in sketches])
    unique, inverse = np.unique(bins, return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([c for _, c in sketches]), minlength=unique.size)
    return unique.astype(np.int64), counts.astype(np.int64)


def sketch_quantile(sketch: tuple[IntArray, IntArray], q: float) -> float:
    """The q-quantile by the "higher" rule of `nan_quantile`: the upper edge of the bin holding that sample (so
    never below it, and above it by at most `SKETCH_RESOLUTION`); NaN for an empty sketch."""
    bins, counts = sketch
    total = int(counts.sum())
    if total == 0:
        return float("nan")
    rank = min(max(int(np.ceil(q * total)), 1), total)
    code = int(bins[int(np.searchsorted(np.cumsum(counts), rank))])
    if code == _ZERO_BIN:
        return 0.0
    if code == _INF_BIN:
        return float("inf")
    return float(np.exp((code + 1) * _LOG_STEP))


def calibration_outliers(
    own: FloatArray, samples: FloatArray, factor_range: tuple[float, float]
) -> npt.NDArray[np.bool_]:
    """Containers whose own factor lies outside the guard `factor_range` (an idle container's 0 excepted): their
    lines are off by more than the guard can mend, so they are left out of the pooled fleet and group factors. A
    quantile only counts samples, so without this a few broken or poisoned containers, a few percent of the samples
    all far above (or below) their lines, would move the factor of every other container."""
    low, high = factor_range
    return (samples > 0) & ~np.isnan(own) & ((own > high) | ((own > 0) & (own < low)))


def calibration_parts(
    chosen_lines: FloatArray,
    past_usage: PastUsage,
    groups: IntArray,
    n_groups: int,
    target_violation: float,
    factor_range: tuple[float, float],
) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_], FloatArray, FloatArray, list[tuple[IntArray, IntArray]]]:
    """The calibration's parts from the chosen lines (origins x containers x steps) and the usage after them, a block
    of containers at a time: per container its own factor (the (1 - target) quantile of its usage / line), the
    samples behind it and whether it is an outlier (`calibration_outliers`); per group the quantile of its other
    containers' pooled ratios and their count; and the `ratio_sketch` of those pooled ratios, one per partition of
    a `FleetUsage` (their merge is the fleet's)."""
    q = 1.0 - target_violation
    n_containers = past_usage.shape[1]
    own, samples = np.full(n_containers, np.nan), np.zeros(n_containers)
    parts = past_usage.part_rows() if isinstance(past_usage, FleetUsage) else [slice(0, n_containers)]
    sketches: list[list[tuple[IntArray, IntArray]]] = [[] for _ in parts]
    blocks = ratio_blocks(chosen_lines, past_usage)
    for rows, ratio in blocks():
        per_container = np.moveaxis(ratio, 1, 0).reshape(ratio.shape[1], -1)
        if per_container.shape[1]:
            own[rows] = nan_quantile(per_container, q)
        samples[rows] = np.sum(~np.isnan(per_container), axis=1)
        # A container's outlier flag is its own: the block's pooled ratios are sketched in the same pass.
        outlying = calibration_outliers(own[rows], samples[rows], factor_range)
        part = next(i for i, bounds in enumerate(parts) if bounds.start <= rows.start < bounds.stop)
        sketches[part].append(ratio_sketch(np.where(outlying[None, :, None], np.nan, ratio)))
    outliers = calibration_outliers(own, samples, factor_range)
    pooled = np.where(outliers, -1, groups)
    if sorted_scoring(chosen_lines, past_usage, q):
        tails = SortedSegments(past_usage).labelled_tails(chosen_lines[:, :, 0], pooled, n_groups, q)
        factors, counts = np.array([t[0] for t in tails]), np.array([t[1] for t in tails])
    else:
        factors, counts = labelled_quantiles(blocks, pooled, n_groups, q)
    shares = [merge_sketches(part) for part in sketches]
    return own, samples, outliers, factors[:n_groups], counts[:n_groups].astype(np.float64), shares


def shrink(own: FloatArray, samples: FloatArray, toward: FloatArray, prior_samples: float) -> FloatArray:
    """Own factors pulled toward `toward` with weight n / (n + prior) on the own one (geometrically: factors are
    ratios); `toward` where there are no own samples or the own factor is not a finite positive number."""
    weight = samples / (samples + prior_samples)
    usable = (samples > 0) & np.isfinite(own) & (own > 0) & np.isfinite(toward) & (toward > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        blended = np.exp(
            weight * np.log(np.where(usable, own, 1.0)) + (1 - weight) * np.log(np.where(usable, toward, 1.0))
        )
    result: FloatArray = np.where(usable, blended, toward)
    return result


def blend_factors(
    own: FloatArray,
    samples: FloatArray,
    groups: IntArray,
    group_factor: FloatArray,
    group_samples: FloatArray,
    fleet: float,
    prior_samples: float,
    group_prior_samples: float,
    factor_range: tuple[float, float],
) -> FloatArray:
    """Each container's factor shrunk toward its group's, each group's toward the fleet's (1 without any sample);
    clipped to `factor_range` only as a guard against a degenerate day, not as the calibration itself."""
    if not np.isfinite(fleet) or fleet <= 0:
        return np.ones(own.shape[0])
    group = shrink(group_factor, group_samples, np.full(group_factor.shape, fleet), group_prior_samples)
    toward = group[groups] if group.size else np.full(own.shape[0], fleet)
    result: FloatArray = np.clip(np.nan_to_num(shrink(own, samples, toward, prior_samples), nan=1.0), *factor_range)
    return result


def history_summary(grid: FloatArray, recent_steps: int) -> FloatArray:
    """Per container (rows): max of the last `recent_steps`, max of all, the count of known steps, and the steps
    since the last known one (the grid's width when none)."""
    known_mask = ~np.isnan(grid)
    # fmax skips NaN (an all-NaN row gives NaN) in one pass, without a masked copy of the grid: the live loop
    # summarises the whole grid every pass.
    recent = np.fmax.reduce(grid[:, -recent_steps:], axis=1) if grid.shape[1] else np.full(grid.shape[0], np.nan)
    observed = np.fmax.reduce(grid, axis=1) if grid.shape[1] else np.full(grid.shape[0], np.nan)
    known = known_mask.sum(axis=1, dtype=np.int64).astype(np.float64)
    # Most rows have their newest step: only the others are searched from the end (the live loop's every pass).
    since = np.zeros(grid.shape[0])
    if grid.shape[1]:
        searched = np.flatnonzero(~known_mask[:, -1])
        since[searched] = np.argmax(known_mask[searched, ::-1], axis=1)
    since[known == 0] = grid.shape[1]
    result: FloatArray = np.empty((grid.shape[0], 4))
    result[:, 0] = np.where(np.isfinite(recent), recent, np.nan)
    result[:, 1] = np.where(np.isfinite(observed), observed, np.nan)
    result[:, 2] = known
    result[:, 3] = since
    return result


def finish_line(
    line: FloatArray,
    summary: FloatArray,
    recent_steps: int,
    cold_start_factor: float,
    steps_per_day: int,
    stale_steps: int,
) -> FloatArray:
    """Reaction, cold start and staleness on a calibrated line (containers x steps), given `history_summary`.

    Fast up: the first `recent_steps` of the line never fall below the max of the last `recent_steps` of usage.
    Cold start: a container with under a day of samples gets `cold_start_factor` x its observed max (NaN if none):
    bounded by what it has shown, never an absurd value. Stale: a container without a sample in the last
    `stale_steps` gets NaN (no forecast is extrapolated from old data; the caller says it is stale).
    """
    recent, observed, known, since = summary[:, 0], summary[:, 1], summary[:, 2], summary[:, 3]
    out = line.copy()
    head = min(recent_steps, out.shape[1])
    if head > 0:
        out[:, :head] = np.fmax(out[:, :head], recent[:, None])
    cold = known < steps_per_day
    out[cold] = (cold_start_factor * observed[cold])[:, None]
    out[since >= stale_steps] = np.nan
    return out


def model_name(estimator: BaseEstimator) -> str:
    """A one-line name of an estimator: its scikit-learn repr (non-default parameters only), without spaces."""
    return repr(estimator).replace("\n", "").replace(" ", "")


def constant_line(line: FloatArray) -> FloatArray:
    """Each row flat at its max (NaN rows stay NaN): the shape of the request and long-term lines."""
    with np.errstate(all="ignore"):
        peak = np.where(np.isnan(line), -np.inf, line).max(axis=1) if line.shape[1] else np.full(line.shape[0], np.nan)
    return np.repeat(np.where(np.isfinite(peak), peak, np.nan)[:, None], line.shape[1], axis=1)


def rolling_origins(n_steps: int, selection_days: int, steps_per_day: int) -> list[int]:
    """Grid positions of the last `selection_days` daily origins that have at least a day of history before them."""
    return [
        n_steps - day * steps_per_day
        for day in range(selection_days, 0, -1)
        if n_steps - day * steps_per_day >= steps_per_day
    ]


def candidate_lines(
    grid: FloatArray,
    candidates: Sequence[BaseEstimator],
    origins: list[int],
    steps_per_day: int,
    constant: Sequence[bool],
    out: Sequence[FloatArray] | None = None,
) -> list[FloatArray]:
    """Each candidate's day-ahead lines from each origin, from data before it only: (origins x containers x steps),
    or (origins x containers x 1) where `constant[m]` (a constant line is one value: memory stays small), written
    into `out` when given (a partition's containers of the fleet's arrays). The candidates are fitted together at
    each origin (`fit_together`: one sort for the decayed quantiles, one windowed quantile for the time-of-day
    windows that differ in their floor)."""
    if out is None:
        out = [np.full((len(origins), grid.shape[0], 1 if flat else steps_per_day), np.nan) for flat in constant]
    out = list(out)
    order = GridOrder(grid)  # one sort of the grid for every origin's windows
    for o, origin in enumerate(origins):
        for m, model in enumerate(fit_together(candidates, grid[:, :origin], order)):
            line = model.predict(steps_per_day)
            out[m][o] = constant_line(line)[:, :1] if constant[m] else line
    return out


def usage_after(grid: FloatArray, origins: list[int], steps: int) -> FloatArray:
    """(origins x containers x steps) usage after each origin, NaN past the grid's end."""
    out = np.full((len(origins), grid.shape[0], steps), np.nan)
    for o, origin in enumerate(origins):
        future = grid[:, origin : origin + steps]
        out[o, :, : future.shape[1]] = future
    return out


def rolling_lines(
    grid: FloatArray,
    candidates: list[BaseEstimator],
    selection_days: int,
    steps_per_day: int,
    constant: bool,
    horizon_days: int = 1,
) -> tuple[list[FloatArray], FloatArray]:
    """Every candidate's `candidate_lines` (origins x containers x steps, or x 1 when `constant`) and the usage that
    followed each origin (origins x containers x steps: a day, or `horizon_days` when constant)."""
    origins = rolling_origins(grid.shape[1], selection_days, steps_per_day)
    past = candidate_lines(grid, candidates, origins, steps_per_day, [constant] * len(candidates))
    return past, usage_after(grid, origins, (horizon_days if constant else 1) * steps_per_day)


def pick_lines(lines: Sequence[FloatArray] | Mapping[int, FloatArray], choice: IntArray, axis: int) -> FloatArray:
    """Each container's line from its chosen candidate (`lines[m]`: containers along `axis`, a constant line may be
    one step wide): only the chosen candidates are read, so the others need not exist."""
    if choice.size == 0:
        # No container: any candidate's shape with none along `axis`.
        available = list(lines.values()) if isinstance(lines, Mapping) else list(lines)
        return np.take(available[0], np.empty(0, dtype=np.int64), axis=axis) if available else np.empty((0, 0))
    shape = list(lines[int(choice[0])].shape)
    shape[axis] = choice.size
    widest = max(lines[int(m)].shape[-1] for m in np.unique(choice))
    shape[-1] = widest
    out = np.empty(shape)
    for m in np.unique(choice):
        rows = np.flatnonzero(choice == m)
        part = np.take(lines[int(m)], rows, axis=axis)
        target_shape = list(part.shape)
        target_shape[-1] = widest
        index: list[Any] = [slice(None)] * out.ndim
        index[axis] = rows
        out[tuple(index)] = np.broadcast_to(part, target_shape)
    return out


#: A `SelectedForecaster`'s fitted attributes with one value per container (the last axis): what `take` cuts.
PER_CONTAINER = ("groups_", "choice_", "costs_", "own_factors_", "calibration_samples_", "outliers_", "factors_")


class SelectedForecaster(BaseEstimator):  # type: ignore[misc]
    """Chooses, for the fleet (and groups of similar containers with strong evidence), the candidate with the lowest
    overprovision at the target violation on a rolling-origin backtest; calibrates it hierarchically.

    `constant=True` makes every line flat at its max over the horizon (the request and long-term lines).
    Fitted: `choice_` (candidate index per container), `fleet_costs_` (candidates), `group_costs_` (groups x
    candidates), `costs_` (candidates x containers: each container's own pinball cost, for reports), `groups_`,
    `factors_`, `group_factors_`, `fleet_factor_`.
    """

    groups_: IntArray
    choice_: IntArray
    costs_: FloatArray
    fleet_costs_: FloatArray
    own_factors_: FloatArray
    calibration_samples_: FloatArray
    ratio_sketch_: tuple[IntArray, IntArray]
    partition_sketches_: list[tuple[IntArray, IntArray]]
    partition_rows_: list[slice]
    outliers_: npt.NDArray[np.bool_]

    def __init__(
        self,
        candidates: list[BaseEstimator] | None = None,
        selection_days: int = 7,
        target_violation: float = 0.01,
        groups: int = 3,
        group_min_gain: float = 0.1,
        group_min_containers: int = 20,
        reference: int = 0,
        fallbacks: tuple[int, ...] = (),
        validation_days: int = 2,
        selection_min_containers: int = 30,
        fairness_tolerance: float = 1.0,
        choice_min_gain: float = 0.05,
        calibration_prior_samples: float = 20_000.0,
        group_prior_samples: float = 20_000.0,
        factor_min: float = 0.25,
        factor_max: float = 4.0,
        recent_steps: int = 12,
        cold_start_factor: float = 1.5,
        stale_steps: int = 3 * STEPS_PER_DAY,
        constant: bool = False,
        horizon_days: int = 1,
        steps_per_day: int = STEPS_PER_DAY,
    ) -> None:
        self.candidates = candidates
        self.selection_days = selection_days
        self.target_violation = target_violation
        self.groups = groups
        self.group_min_gain = group_min_gain
        self.group_min_containers = group_min_containers
        self.reference = reference
        self.fallbacks = fallbacks
        self.validation_days = validation_days
        self.selection_min_containers = selection_min_containers
        self.fairness_tolerance = fairness_tolerance
        self.choice_min_gain = choice_min_gain
        self.calibration_prior_samples = calibration_prior_samples
        self.group_prior_samples = group_prior_samples
        self.factor_min = factor_min
        self.factor_max = factor_max
        self.recent_steps = recent_steps
        self.cold_start_factor = cold_start_factor
        self.stale_steps = stale_steps
        self.constant = constant
        self.horizon_days = horizon_days
        self.steps_per_day = steps_per_day

    def candidate_models(self) -> list[BaseEstimator]:
        """The candidates (a flat quantile at the target level when none are given)."""
        return (
            list(self.candidates)
            if self.candidates
            else [FlatQuantileForecaster(quantile=1.0 - self.target_violation, steps_per_day=self.steps_per_day)]
        )

    def fit(self, X: Any, y: Any = None) -> Self:
        grid = check_grid(X, type(self).__name__)
        candidates = self.candidate_models()
        past, actual = rolling_lines(
            grid, candidates, self.selection_days, self.steps_per_day, self.constant, self.horizon_days
        )
        return self.fit_lines(grid, past, actual, lambda m: clone(candidates[m]).fit(grid))

    def fit_lines(
        self,
        grid: FloatArray,
        past_lines: Sequence[FloatArray],
        past_usage: PastUsage,
        fit: Callable[[int], BaseEstimator],
        rows: IntArray | None = None,
    ) -> Self:
        """`fit` from the candidates' rolling lines and usage (`rolling_lines`), computed once when several lines
        share candidates, for the grid rows `rows` (all by default). `fit(m)` gives candidate m fitted on those rows
        of the grid: only the chosen candidates are fitted and kept. The other rows draw no line of their own (their
        line is the cold start of `finish_line`, or NaN)."""
        return self.decide(past_lines, past_usage).fit_chosen(grid, fit, rows)

    def fit_chosen(
        self,
        grid: FloatArray,
        fit: Callable[[int], BaseEstimator],
        rows: IntArray | None = None,
        decided: IntArray | None = None,
        groups: IntArray | None = None,
    ) -> Self:
        """After `decide` (or `take`): fit the chosen candidates (`fit(m)`, on the grid rows `rows`, all by default)
        and keep the grid's recent state for the lines' finish. `decided`: the grid rows the decision was made on
        (`rows` by default); the others of `rows` take their group's candidate and factor (`groups`: per grid row;
        `_expand`)."""
        decided = rows if decided is None else decided
        if decided is not None:
            self._expand(decided, grid.shape[0], groups)
        self.rows_ = rows
        self.fitted_ = {int(m): fit(int(m)) for m in np.unique(self.choice_)}
        self.summary_ = history_summary(grid, self.recent_steps)
        return self

    def take(self, partition: int) -> SelectedForecaster:
        """The decision made on a `FleetUsage` for the containers of one of its partitions: their own state, the
        fleet's choice and factors, and their share of the fleet's calibration sketch (the shares merge to it)."""
        check_is_fitted(self, "partition_sketches_")
        part = copy.copy(self)
        rows = self.partition_rows_[partition]
        for name in PER_CONTAINER:
            setattr(part, name, getattr(self, name)[..., rows])
        part.ratio_sketch_ = self.partition_sketches_[partition]
        part.partition_sketches_ = [part.ratio_sketch_]
        part.partition_rows_ = [slice(0, rows.stop - rows.start)]
        return part

    def _expand(self, rows: IntArray, n_rows: int, groups: IntArray | None = None) -> None:
        """Per-container state for `n_rows` containers from a decision on the containers at `rows`: the others take
        their group's choice (`groups`: per container, -1 or None for none: then the fleet's choice and group 0)
        and no own calibration samples (so their group's factor, the fleet's with the default priors)."""
        fleet_choice = self.fleet_choice_
        # A group's containers all have its choice (`choose_models`); a group with none decided takes the fleet's.
        group_choice = np.full(max(self.groups, 1), fleet_choice, dtype=np.int64)
        group_choice[self.groups_] = self.choice_

        def spread(values: npt.NDArray[Any], fill: Any) -> npt.NDArray[Any]:
            out = np.full((*values.shape[:-1], n_rows), fill, dtype=values.dtype)
            out[..., rows] = values
            return out

        placed = np.full(n_rows, -1, dtype=np.int64) if groups is None else groups.astype(np.int64)
        placed[rows] = -1
        choice = np.where(placed >= 0, group_choice[np.maximum(placed, 0)], fleet_choice)
        choice[rows] = self.choice_
        placed[rows] = self.groups_
        self.groups_, self.choice_ = np.maximum(placed, 0), choice
        self.costs_ = spread(self.costs_, np.nan)
        self.own_factors_ = spread(self.own_factors_, np.nan)
        self.calibration_samples_ = spread(self.calibration_samples_, 0.0)
        self.outliers_ = spread(self.outliers_, False)
        self.partition_rows_ = [slice(0, n_rows)]
        self._blend()

    def decide(
        self, past_lines: Sequence[FloatArray], past_usage: PastUsage, scores: CandidateScores | None = None
    ) -> Self:
        """Choose and calibrate from candidates' past lines (each origins x containers x steps) and usage (a
        `FleetUsage` of partitions, whose containers the lines concatenate, for a fleet in partitions: `take` then
        gives each partition its part of the decision). `scores`: the candidates' scores against this usage kept
        across the lines deciding on it (`CandidateScores`; by default this decision's own).

        Keeps the calibration's parts (`own_factors_`, `calibration_samples_`, `ratio_sketch_`) so that a partition of
        a fleet can be recalibrated with the whole fleet's factor (`calibrate_with_fleet`)."""
        n_models, n_groups = len(past_lines), past_usage.shape[1]
        empty = past_usage.shape[0] == 0 or n_models == 0 or n_groups == 0
        self.partition_rows_ = past_usage.part_rows() if isinstance(past_usage, FleetUsage) else [slice(0, n_groups)]
        scores = CandidateScores() if scores is None else scores
        self.groups_ = np.zeros(n_groups, dtype=np.int64) if empty else scores.groups(past_usage, self.groups)
        group_count = max(self.groups, 1)
        if empty:
            self.costs_ = np.full((n_models, n_groups), np.nan)
            self.group_costs_ = np.full((group_count, n_models, 2), np.nan)
            self.fleet_costs_ = np.full((n_models, 2), np.nan)
            self.choice_ = np.zeros(n_groups, dtype=np.int64)
            self.fleet_choice_, self.validated_, self.small_fleet_ = 0, False, False
            self.own_factors_ = np.full(n_groups, np.nan)
            self.calibration_samples_ = np.zeros(n_groups)
            self.outliers_ = np.zeros(n_groups, dtype=bool)
            self.group_factors_raw_, self.group_samples_ = np.full(group_count, np.nan), np.zeros(group_count)
            self.ratio_sketch_ = ratio_sketch(np.empty(0))
            self.partition_sketches_ = [self.ratio_sketch_ for _ in self.partition_rows_]
        else:
            names, target = self.model_names(), self.target_violation
            self.costs_ = scores.per_candidate(
                "selection", names, past_lines, target, 0, lambda lines: selection_costs(lines, past_usage, target)
            )
            labels, n_labels = self.groups_, int(self.groups_.max()) + 1
            labelled = scores.per_candidate(
                f"labelled/{self.groups}",
                names,
                past_lines,
                target,
                1,
                lambda lines: labelled_costs(lines, past_usage, target, labels, n_labels, scores.totals(past_usage)),
            )
            self.choice_, self.fleet_costs_, group_costs = choose_models(
                labelled,
                self.groups_,
                self.target_violation,
                self.group_min_gain,
                self.group_min_containers,
                self.reference,
                self.fairness_tolerance,
                lambda choice: pooled_choice_cost(
                    past_lines, choice, past_usage, target, labels, scores.totals(past_usage)
                ),
                self.choice_min_gain,
            )
            self.group_costs_ = np.full((group_count, n_models, 2), np.nan)
            self.group_costs_[: group_costs.shape[0]] = group_costs
            tolerance = self.fairness_tolerance * target
            self.fleet_choice_ = cheapest_fair(self.fleet_costs_, self.reference, tolerance, self.choice_min_gain)
            with_usage = int(np.count_nonzero(scores.totals(past_usage)[0] > 0))
            self.small_fleet_ = with_usage < self.selection_min_containers
            self.validated_ = not self.small_fleet_ and (
                not self.fallbacks or not self.validation_days or self._validated(past_lines, past_usage, scores)
            )
            if self.small_fleet_:
                # Too few containers for a choice to be evidence: the reference (the flat quantile of the longest
                # window at the asked level) as it is (`_blend`), so no line hangs on a near-tie or on the others.
                self.fleet_choice_ = self.reference
            elif not self.validated_:
                self.fleet_choice_ = cheapest_fallback(
                    self.fleet_costs_, self.fallbacks, self.reference, tolerance, self.choice_min_gain
                )
            if not self.validated_:
                self.choice_ = np.full(n_groups, self.fleet_choice_, dtype=np.int64)
            (
                self.own_factors_,
                self.calibration_samples_,
                self.outliers_,
                self.group_factors_raw_,
                self.group_samples_,
                self.partition_sketches_,
            ) = calibration_parts(
                pick_lines(past_lines, self.choice_, axis=1),
                past_usage,
                self.groups_,
                group_count,
                self.target_violation,
                (self.factor_min, self.factor_max),
            )
            shares = self.partition_sketches_
            self.ratio_sketch_ = shares[0] if len(shares) == 1 else merge_sketches(shares)
        return self.calibrate_with_fleet(self.ratio_sketch_)

    def _validated(self, past_lines: Sequence[FloatArray], past_usage: PastUsage, scores: CandidateScores) -> bool:
        """Whether the choice among every candidate would have won on days it did not see: made as `decide` makes it
        on the origins whose scored usage ends before the last `validation_days` origins, it must be at least as
        cheap on those last origins as the cheapest of the `fallbacks` (the baselines' flat rules) chosen on the same
        earlier origins, at the fleet's pooled matched level, with a p90 container violation at most the rule's plus
        the fairness tolerance. True where no origin's usage ends before the held-out ones (the long-term line's weeks, or a
        young fleet): the check cannot be made there, and on the development half a flat rule chosen without it
        cost the long-term line up to 1.6x at a 1 % risk (docs/benchmarks.md)."""
        n_origins, target = past_usage.shape[0], self.target_violation
        days = -(-past_usage.shape[2] // self.steps_per_day)  # each origin's usage, in days (origins are daily)
        late = np.arange(n_origins) >= n_origins - self.validation_days
        early = np.arange(n_origins) + days <= n_origins - self.validation_days
        if not early.any():
            return True
        labels, n_labels = self.groups_, int(self.groups_.max()) + 1
        early_lines, early_totals = origins_only(past_lines, early), usage_totals(past_usage, early)
        early = labelled_costs(early_lines, past_usage, target, labels, n_labels, early_totals)
        choice, fleet, _ = choose_models(
            early,
            labels,
            target,
            self.group_min_gain,
            self.group_min_containers,
            self.reference,
            self.fairness_tolerance,
            lambda picked: pooled_choice_cost(early_lines, picked, past_usage, target, labels, early_totals),
            self.choice_min_gain,
        )
        tolerance = self.fairness_tolerance * target
        flat = np.full(
            choice.size, cheapest_fallback(fleet, self.fallbacks, self.reference, tolerance, self.choice_min_gain)
        )
        late_totals = usage_totals(past_usage, late)
        ours, theirs = (
            pooled_choice_cost(
                {int(m): origins_only([past_lines[int(m)]], late)[0] for m in np.unique(picked)},
                picked,
                past_usage,
                target,
                labels,
                late_totals,
            )
            for picked in (choice, flat)
        )
        return bool(ours[0] <= theirs[0] and not ours[1] > theirs[1])

    def calibrate_with_fleet(self, fleet_sketch: tuple[IntArray, IntArray]) -> Self:
        """Set `factors_` from the own and group factors and the fleet factor read from `fleet_sketch` (this fit's own
        sketch, or the merged sketches of every partition of the fleet)."""
        check_is_fitted(self, "ratio_sketch_")
        self.fleet_factor_ = sketch_quantile(fleet_sketch, 1.0 - self.target_violation)
        return self._blend()

    def _blend(self) -> Self:
        """`group_factors_` and `factors_` from the own and group factors and `fleet_factor_`; on a small fleet 1 for
        every container: its line is the reference built at the asked level as it is, from its own samples only
        (a factor pooled over a few containers is set by the burstiest of them, and own factors are noisy: both
        were dearer on the development half cut into fleets of 10, docs/benchmarks.md)."""
        self.group_factors_ = shrink(
            self.group_factors_raw_,
            self.group_samples_,
            np.full(self.group_factors_raw_.shape, self.fleet_factor_),
            self.group_prior_samples,
        )
        if getattr(self, "small_fleet_", False):  # False in models stored before small fleets stood alone
            self.factors_ = np.ones(self.own_factors_.shape[0])
            return self
        self.factors_ = blend_factors(
            self.own_factors_,
            self.calibration_samples_,
            self.groups_,
            self.group_factors_raw_,
            self.group_samples_,
            self.fleet_factor_,
            self.calibration_prior_samples,
            self.group_prior_samples,
            (self.factor_min, self.factor_max),
        )
        return self

    def _shape(self, line: FloatArray) -> FloatArray:
        return constant_line(line) if self.constant else line

    def combine(self, lines: Sequence[FloatArray] | Mapping[int, FloatArray], summary: FloatArray) -> FloatArray:
        """The final line from the candidates' current lines (`lines[m]`: containers x steps; only the chosen
        candidates are read) and `history_summary`."""
        check_is_fitted(self, "choice_")
        picked = pick_lines(lines, self.choice_, axis=0) * self.factors_[:, None]
        # Fast up belongs to the short-term line: a constant line is flat at its max, so it would take a spike's height.
        recent = 0 if self.constant else self.recent_steps
        finished = finish_line(picked, summary, recent, self.cold_start_factor, self.steps_per_day, self.stale_steps)
        return self._shape(finished)

    def predict(self, n_steps: int, offset: int = 0) -> FloatArray:
        """The line of `n_steps` from `offset` steps after the fitted grid's end, finished with the recent state
        (`summary_`: the fast-up head is its first steps)."""
        check_is_fitted(self, "fitted_")
        if self.choice_.size == 0:
            return np.zeros((0, n_steps))
        rows = getattr(self, "rows_", None)  # None also in models stored before rows were kept: every row fitted

        def drawn(model: BaseEstimator) -> FloatArray:
            line: FloatArray = self._shape(model.predict(offset + n_steps)[:, offset:])
            if rows is None:
                return line
            full = np.full((self.choice_.size, n_steps), np.nan)
            full[rows] = line
            return full

        return self.combine({int(m): drawn(self.fitted_[int(m)]) for m in np.unique(self.choice_)}, self.summary_)

    def model_names(self) -> list[str]:
        """A short name of each candidate, e.g. `WindowQuantileForecaster(window_steps=36)`."""
        return [model_name(candidate) for candidate in self.candidate_models()]


def short_term_candidates(settings: ForecastSettings, target_violation: float) -> list[BaseEstimator]:
    """The short-term candidates at level 1 - target: time-of-day windows (with and without a floor of the flat
    quantile), statsmodels STL when enabled, and every constant candidate."""
    days, q = settings.seasonal_days, 1.0 - target_violation
    narrow, wide = settings.narrow_window_steps, settings.wide_window_steps
    seasonal = [
        WindowQuantileForecaster(days=days, window_steps=narrow, quantile=q, floor_quantile=q, floor_fraction=fraction)
        for fraction in (0.5, 0.8)
    ] + [WindowQuantileForecaster(days=days, window_steps=wide, quantile=q, floor_quantile=q, floor_fraction=0.5)]
    stl: list[BaseEstimator] = [StlForecaster(days=days, quantile=q)] if settings.use_stl else []
    return distinct([*seasonal, *stl, *constant_candidates(settings, target_violation), seasonal_naive_rule(settings)])


def distinct(candidates: list[BaseEstimator]) -> list[BaseEstimator]:
    """The candidates without repeats (by `model_name`), in order: a baseline's rule may be one of ours too."""
    names = [model_name(c) for c in candidates]
    return [c for i, c in enumerate(candidates) if names.index(names[i]) == i]


#: KRR simple's CPU percentile and seasonal naive's request percentile (anchors.md): a baseline's own level.
BASELINE_PERCENTILE = 0.95


def flat_rules(settings: ForecastSettings) -> list[BaseEstimator]:
    """The flat baselines' own rules, at their own percentiles whatever the asked level (the fleet factor scales a
    line to the level, and a cost at a matched level does not depend on the scale): Koordinator mid's
    recency-weighted percentile for CPU and memory and VPA's CPU target (their decaying histograms without the
    buckets), KRR simple's p95 and max of `history_days`, and seasonal naive's p95 and max of `seasonal_days`.
    The fallbacks of the day-ahead choice (`SelectedForecaster._validated`)."""
    long, week, vpa = float(settings.history_days), float(settings.seasonal_days), VpaRecommender()

    def decayed(quantile: float, half_life_seconds: float) -> BaseEstimator:
        return DecayedQuantileForecaster(days=long, quantile=quantile, half_life_steps=int(half_life_seconds // 300))

    return [
        *(decayed(KOORDINATOR_MID_QUANTILE[r], KOORDINATOR_MID_HALF_LIFE_SECONDS[r]) for r in ("cpu", "memory")),
        decayed(vpa.target_percentile, vpa.cpu_half_life_seconds),
        DecayedPeakForecaster(quantile=vpa.target_percentile, half_life_steps=int(vpa.memory_half_life_seconds // 300)),
        *(FlatQuantileForecaster(days=d, quantile=q) for d in (long, week) for q in (BASELINE_PERCENTILE, 1.0)),
    ]


def seasonal_naive_rule(settings: ForecastSettings) -> BaseEstimator:
    """Seasonal naive's short-term line: the max of the last `seasonal_days` at the same time of day +- 5 minutes."""
    return WindowQuantileForecaster(
        days=settings.seasonal_days, window_steps=1, quantile=1.0, floor_quantile=1.0, floor_fraction=0.0
    )


def constant_candidates(settings: ForecastSettings, target_violation: float) -> list[BaseEstimator]:
    """Flat rules at level 1 - target: the quantile of the last 1, 3, 7 and `history_days` days, the max of the last
    1, 7 and `history_days` days, and decayed quantiles (half-lives 12 h, 1 and 3 days; Koordinator- and VPA-like)."""
    q, long = 1.0 - target_violation, float(settings.history_days)
    flat: list[BaseEstimator] = [FlatQuantileForecaster(days=d, quantile=q) for d in (1.0, 3.0, 7.0)]
    flat.append(reference_candidate(settings, target_violation))
    peaks = [FlatQuantileForecaster(days=d, quantile=1.0) for d in (1.0, 7.0, long)]
    decayed = [
        DecayedQuantileForecaster(days=long, quantile=q, half_life_steps=int(hours * STEPS_PER_DAY / 24))
        for hours in (12, 24, 72)
    ]
    mixed = [
        MultiWindowQuantileForecaster(days=long, quantile=q),
        MultiWindowQuantileForecaster(days=long, shortest_days=3.0, windows=3, quantile=q),
    ]
    return distinct([*flat, *peaks, *decayed, *mixed, *flat_rules(settings)])


#: The long-term line holds for a week: its candidates are scored on the week after each origin.
LONG_TERM_DAYS = 7
#: Days each line holds for: its candidates are scored on that many days after each origin.
LINE_DAYS = {"short_term": 1, "request": 1, "long_term": LONG_TERM_DAYS}


def line_forecaster(settings: ForecastSettings, line: str) -> SelectedForecaster:
    """The unfitted `SelectedForecaster` of one line (`short_term`, `request`, `long_term`) at its risk level in
    `settings`, with its candidates: the one place the lines' candidates, shapes and horizons are set (training,
    `backtest` and the node backtest all build them here)."""
    target = settings.target_for(line)
    candidates = (short_term_candidates if line == "short_term" else constant_candidates)(settings, target)
    return selected_forecaster(settings, candidates, target, line != "short_term", LINE_DAYS[line])


def reference_candidate(settings: ForecastSettings, target_violation: float) -> BaseEstimator:
    """The flat quantile of the longest window at the asked level (KRR's shape): the fairness reference of selection."""
    return FlatQuantileForecaster(days=float(settings.history_days), quantile=1.0 - target_violation)


def selected_forecaster(
    settings: ForecastSettings, candidates: list[BaseEstimator], target: float, constant: bool, horizon_days: int = 1
) -> SelectedForecaster:
    """A `SelectedForecaster` over `candidates` with the settings' selection and calibration parameters."""
    names = [model_name(c) for c in candidates]
    reference = model_name(reference_candidate(settings, target))
    rules = [model_name(c) for c in [*flat_rules(settings), seasonal_naive_rule(settings)]]
    return SelectedForecaster(
        candidates=candidates,
        selection_days=settings.selection_days,
        target_violation=target,
        groups=settings.selection_groups,
        group_min_gain=settings.group_min_gain,
        group_min_containers=settings.group_min_containers,
        reference=names.index(reference) if reference in names else 0,
        fallbacks=tuple(m for m, name in enumerate(names) if name in rules),
        validation_days=settings.validation_days,
        selection_min_containers=settings.selection_min_containers,
        fairness_tolerance=settings.fairness_tolerance,
        choice_min_gain=settings.choice_min_gain,
        calibration_prior_samples=settings.calibration_prior_samples,
        group_prior_samples=settings.group_prior_samples,
        factor_min=settings.calibration_factor_min,
        factor_max=settings.calibration_factor_max,
        recent_steps=settings.recent_window_steps,
        cold_start_factor=settings.cold_start_factor,
        stale_steps=int(settings.stale_after_seconds // 300),
        constant=constant,
        horizon_days=horizon_days,
    )


def daily_maxima(grid: FloatArray, days: int, steps_per_day: int) -> FloatArray:
    """(containers x days) max of each of the last `days` whole days of the grid (oldest first), NaN where none."""
    # Only the days the grid reaches are padded and reduced (a day-wide grid costs a day, not `days`).
    present = min(days, -(-grid.shape[1] // steps_per_day))
    width = present * steps_per_day
    block = np.full((grid.shape[0], width), -np.inf)
    recent = grid[:, -width:] if width else grid[:, :0]
    block[:, width - recent.shape[1] :] = np.where(np.isnan(recent), -np.inf, recent)
    result: FloatArray = np.full((grid.shape[0], days), np.nan)
    if present:
        peaks = block.reshape(grid.shape[0], present, steps_per_day).max(axis=2)
        result[:, days - present :] = np.where(np.isfinite(peaks), peaks, np.nan)
    return result


#: Peak candidates: summaries of the last week's daily maxima (name, days, statistic).
PEAK_RULES = (
    ("last day's max", 1, "mean"),
    ("mean of 3 daily maxima", 3, "mean"),
    ("mean of 7 daily maxima", 7, "mean"),
    ("median of 7 daily maxima", 7, "median"),
)


def peak_candidates(grid: FloatArray, steps_per_day: int) -> FloatArray:
    """(rules x containers) each `PEAK_RULES` summary of the daily maxima before the grid's end."""
    weekly = daily_maxima(grid, 7, steps_per_day)
    out = []
    for _, days, statistic in PEAK_RULES:
        part = weekly[:, -days:]
        known = ~np.isnan(part)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(known.any(axis=1), np.where(known, part, 0.0).sum(axis=1) / known.sum(axis=1), np.nan)
        out.append(mean if statistic == "mean" else nan_quantile(part, 0.5))
    return np.stack(out)


class PeakForecaster(BaseEstimator):  # type: ignore[misc]
    """The next day's maximum as a point forecast: the fleet's most accurate summary of recent daily maxima
    (median absolute percentage error over the last `selection_days` rolling origins), scaled so that a `quantile`
    share of those days peaked at or below it (slightly above the median: about half the days peak above a
    median forecast, and the peak is read as a warning level). Fitted: `choice_`, `errors_`, `factor_`, `level_`."""

    def __init__(self, selection_days: int = 7, quantile: float = 0.55, steps_per_day: int = STEPS_PER_DAY) -> None:
        self.selection_days = selection_days
        self.quantile = quantile
        self.steps_per_day = steps_per_day

    def fit(self, X: Any, y: Any = None) -> Self:
        return self.fit_parts([check_grid(X, type(self).__name__)])

    def fit_parts(self, grids: Sequence[FloatArray]) -> Self:
        """`fit` on the rows of several grids of one width (a fleet's partitions) as on one grid of them all: the
        summaries are per container, so no copy of the fleet's grid is made."""
        per_day, n = self.steps_per_day, grids[0].shape[1]
        forecasts, actuals = [], []
        for day in range(self.selection_days, 0, -1):
            origin = n - day * per_day
            if origin < per_day:
                continue
            forecasts.append(np.concatenate([peak_candidates(grid[:, :origin], per_day) for grid in grids], axis=1))
            actuals.append(
                np.concatenate([daily_maxima(grid[:, : origin + per_day], 1, per_day)[:, 0] for grid in grids])
            )
        self.errors_ = np.full(len(PEAK_RULES), np.nan)
        self.choice_, self.factor_ = len(PEAK_RULES) - 2, 1.0
        if forecasts:
            past, actual = np.stack(forecasts, axis=1), np.stack(actuals)[None]
            scored = ~np.isnan(past) & ~np.isnan(actual) & (actual > 0) & (past > 0)
            with np.errstate(all="ignore"):
                error = np.abs(past - actual) / actual
            for r in range(len(PEAK_RULES)):
                if scored[r].any():
                    self.errors_[r] = float(np.median(error[r][scored[r]]))
            if np.isfinite(self.errors_).any():
                self.choice_ = int(np.nanargmin(self.errors_))
                with np.errstate(all="ignore"):
                    ratio = (actual[0] / past[self.choice_])[scored[self.choice_]]
                self.factor_ = _higher_quantile(ratio, self.quantile) if ratio.size else 1.0
        self.level_ = np.concatenate([peak_candidates(grid, per_day)[self.choice_] for grid in grids]) * self.factor_
        return self

    def predict(self) -> FloatArray:
        check_is_fitted(self, "level_")
        result: FloatArray = self.level_
        return result

    def take(self, rows: slice) -> PeakForecaster:
        """This fit for the containers `rows` only: the fleet's rule and factor, their levels."""
        check_is_fitted(self, "level_")
        part = copy.copy(self)
        part.level_ = self.level_[rows]
        return part

    def name(self) -> str:
        return f"{PEAK_RULES[self.choice_][0]} x{self.factor_:.3g}"
