"""VPA-compatible decaying exponential histograms, fitted for many groups (workload containers) at once.

The bucket layout, the upper-edge percentile, the epsilon rule and the half-life decay with its re-based reference
timestamp follow the VPA recommender (anchors.md section 2), so a percentile here equals VPA's for the same samples.
All groups share one weight table, so fitting two million samples is a single `bincount`. It keeps only the buckets
that got a sample (a dense groups x buckets matrix is 1.4 KB a group however few its samples: 134 MB for 100,000
containers of one sample, four such histograms to a fit), and is made dense by blocks of groups to be read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from models._validation import factorize_groups, require_columns, united_labels
from models.migration import migrate_histogram_state
from recommender.arrays import FloatArray, IntArray, spliced

#: The learned weights' attributes (`DecayingHistogram`).
_WEIGHTS = ("weight_starts_", "weight_buckets_", "weight_values_")

#: VPA re-bases the reference timestamp when a sample is more than this many half-lives after it.
MAX_DECAY_EXPONENT = 100


@dataclass(frozen=True)
class ExponentialBuckets:
    """Bucket n >= 1 starts at first * (r^n - 1) / (r - 1) with r = 1 + growth; bucket 0 is [0, first)."""

    first_bucket_size: float
    max_value: float
    growth_ratio: float

    @cached_property
    def num_buckets(self) -> int:
        ratio = 1.0 + self.growth_ratio
        return int(math.ceil(math.log(self.max_value * (ratio - 1) / self.first_bucket_size + 1, ratio))) + 1

    @cached_property
    def starts(self) -> FloatArray:
        ratio = 1.0 + self.growth_ratio
        n = np.arange(self.num_buckets, dtype=np.float64)
        starts: FloatArray = self.first_bucket_size * (np.power(ratio, n) - 1.0) / (ratio - 1.0)
        starts[0] = 0.0
        return starts

    def find(self, values: FloatArray) -> IntArray:
        """Bucket index of each value; below the first bucket -> 0, beyond the last -> the last."""
        ratio = 1.0 + self.growth_ratio
        scaled = np.maximum(values, 0.0) * (ratio - 1.0) / self.first_bucket_size + 1.0
        # One log implementation for both terms, as VPA's Log(x) / Log(base): a value on a boundary lands on it (the
        # base's log through the same array loop as the values', once).
        index: IntArray = np.floor(np.log(scaled) / np.log(np.full(1, ratio))).astype(np.int64)
        index[values < self.first_bucket_size] = 0
        return np.clip(index, 0, self.num_buckets - 1)


@dataclass(frozen=True)
class LinearBuckets:
    """Bucket n starts at n x bucket_size; the last starts at or above max_value (VPA's linear layout)."""

    bucket_size: float
    max_value: float

    @cached_property
    def num_buckets(self) -> int:
        return int(math.ceil(self.max_value / self.bucket_size)) + 1

    @cached_property
    def starts(self) -> FloatArray:
        starts: FloatArray = np.arange(self.num_buckets, dtype=np.float64) * self.bucket_size
        return starts

    def find(self, values: FloatArray) -> IntArray:
        """Bucket index of each value (the division truncated), clipped to the layout."""
        index = np.trunc(np.asarray(values, dtype=np.float64) / self.bucket_size)
        result: IntArray = np.clip(index, 0, self.num_buckets - 1).astype(np.int64)
        return result


def vpa_reference_timestamps(
    group_codes: IntArray, timestamps: FloatArray, start: FloatArray, half_life: float
) -> FloatArray:
    """Replay VPA's reference re-basing: the reference moves to a sample's time (rounded to the half-life)
    whenever that sample is more than MAX_DECAY_EXPONENT half-lives after it.

    `start` holds each group's reference before these samples (NaN for a new group). Returns the final reference
    per group; a sample's weight is scaled by 2^((t - final) / half_life), which equals VPA's sequence of
    multiplications and re-scalings exactly (they are powers of two).
    """
    first, last = _group_span(group_codes, timestamps, start.size)
    return _references(group_codes, timestamps, start, half_life, first, last)


def _merged_cells(
    cells: IntArray, weights: FloatArray, new_cells: IntArray, added: FloatArray
) -> tuple[IntArray, FloatArray]:
    """Sorted distinct cells and their weights with `added` summed in at `new_cells` (sorted, distinct): a cell kept
    gets its weight plus the new one, a new cell the new one. Found by a binary search, inserted in one pass: a live
    pass adds a cell or two per group to hundreds of thousands kept, which a sort of them all cost every pass."""
    at = np.searchsorted(cells, new_cells)
    found = at < cells.size
    found[found] = cells[at[found]] == new_cells[found]
    weights[at[found]] += added[found]
    fresh = ~found
    none = np.zeros(0, np.int64)
    return spliced(cells, none, at[fresh], new_cells[fresh]), spliced(weights, none, at[fresh], added[fresh])


def _group_span(group_codes: IntArray, timestamps: FloatArray, n_groups: int) -> tuple[FloatArray, FloatArray]:
    """Each group's first and last sample time (+inf / -inf for a group without samples)."""
    first = np.full(n_groups, np.inf)
    last = np.full(n_groups, -np.inf)
    np.minimum.at(first, group_codes, timestamps)
    np.maximum.at(last, group_codes, timestamps)
    return first, last


def _references(
    group_codes: IntArray,
    timestamps: FloatArray,
    start: FloatArray,
    half_life: float,
    first: FloatArray,
    last: FloatArray,
) -> FloatArray:
    """`vpa_reference_timestamps` given each group's first and last sample of these: a new group starts at its first
    sample rounded; only a group whose samples span more than MAX_DECAY_EXPONENT half-lives past its reference (none
    in a 14-day history at a day's half-life) replays its samples in time order."""
    reference = start.copy()
    present = first <= last
    fresh = present & np.isnan(reference)
    reference[fresh] = _round_half_away(first[fresh], half_life)
    horizon = MAX_DECAY_EXPONENT * half_life
    for g in np.flatnonzero(present & (last > reference + horizon)):
        seg_times = np.sort(timestamps[group_codes == g])
        ref = float(reference[g])
        while seg_times[-1] > ref + horizon:
            first_beyond = seg_times[np.searchsorted(seg_times, ref + horizon, side="right")]
            ref = float(_round_half_away(np.asarray(first_beyond), half_life))
        reference[g] = ref
    return reference


def _round_half_away(t: FloatArray, unit: float) -> FloatArray:
    """Go's time.Round of each time: to the nearest multiple of unit, halves away from zero."""
    rounded: FloatArray = np.copysign(np.floor(np.abs(t) / unit + 0.5), t) * unit
    return rounded


class DecayingHistogram(BaseEstimator):  # type: ignore[misc]
    """Per-group decaying histogram of samples; `quantile(q)` returns VPA's percentile for every group.

    Fit on a frame with columns `group` (any string label), `timestamp` (Unix seconds) and `value`; rows with a
    missing value are skipped. `partial_fit` continues from the learned state, giving the same weights as one fit
    on all the samples (the decay is exact), which is what makes incremental training possible.
    """

    groups_: npt.NDArray[np.str_]
    #: The weights, sparse: row pointers per group, then each kept bucket's index and weight (sorted by group and
    #: bucket); `weights(rows)` makes them dense.
    weight_starts_: IntArray
    weight_buckets_: IntArray
    weight_values_: FloatArray
    reference_timestamp_: FloatArray
    first_sample_: FloatArray
    last_sample_: FloatArray
    sample_count_: IntArray

    #: Groups whose weights are made dense at once to be read (about 1.4 MB a block, whatever the fleet's size).
    BLOCK_ROWS = 1024

    def __init__(
        self,
        first_bucket_size: float = 0.01,
        max_value: float = 1000.0,
        bucket_growth_ratio: float = 0.05,
        half_life_seconds: float = 86400.0,
        sample_weight: float = 0.1,
        epsilon: float = 1e-4,
    ) -> None:
        self.first_bucket_size = first_bucket_size
        self.max_value = max_value
        self.bucket_growth_ratio = bucket_growth_ratio
        self.half_life_seconds = half_life_seconds
        self.sample_weight = sample_weight
        self.epsilon = epsilon

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(migrate_histogram_state(state))

    @property
    def buckets(self) -> ExponentialBuckets:
        return ExponentialBuckets(self.first_bucket_size, self.max_value, self.bucket_growth_ratio)

    def fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        for name in ("groups_", *_WEIGHTS, "reference_timestamp_", "first_sample_", "last_sample_", "sample_count_"):
            if hasattr(self, name):
                delattr(self, name)
        return self.partial_fit(X)

    def partial_fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        require_columns(X, ("group", "timestamp", "value"), type(self).__name__)
        values = X["value"].to_numpy(dtype=np.float64)
        known = ~np.isnan(values)
        everything = bool(known.all())
        groups = X["group"]
        if isinstance(groups.dtype, pd.CategoricalDtype):
            # Every category is a group, with samples or not (as a categorical column's labels always were).
            local_codes, local_labels = factorize_groups(groups)
            local_codes = local_codes if everything else local_codes[known]
        else:
            local_codes, local_labels = factorize_groups(groups if everything else groups[known])
        times = X["timestamp"].to_numpy(dtype=np.float64)
        if not everything:
            values, times = values[known], times[known]
        return self.add_samples(local_codes, local_labels, times, values)

    def add_samples(self, local_codes: IntArray, local_labels: pd.Index, times: FloatArray, values: FloatArray) -> Self:
        """`partial_fit` of samples given as arrays: group `local_labels[local_codes[i]]` at `times[i]` (Unix
        seconds) used `values[i]`; the labels' order is the order new groups take in `groups_`."""
        if np.any(values < 0) or not np.all(np.isfinite(values)):
            raise ValueError("histogram samples must be finite and non-negative")
        buckets = self.buckets
        previous = self.groups_ if hasattr(self, "groups_") else np.zeros(0, dtype=str)
        labels, positions = united_labels(previous, local_labels)
        n_groups = len(labels)
        k = len(previous)
        width = buckets.num_buckets
        reference = np.full(n_groups, np.nan)
        first = np.full(n_groups, np.inf)
        last = np.full(n_groups, -np.inf)
        count = np.zeros(n_groups, dtype=np.int64)
        cells, weights = np.zeros(0, dtype=np.int64), np.zeros(0)
        if k:
            reference[:k] = self.reference_timestamp_
            first[:k], last[:k], count[:k] = self.first_sample_, self.last_sample_, self.sample_count_
            cell_rows = np.repeat(np.arange(k, dtype=np.int64), np.diff(self.weight_starts_))
            cells, weights = cell_rows * width + self.weight_buckets_, self.weight_values_.copy()
        if local_codes.size:
            codes = positions[local_codes] if k else local_codes
            new_first, new_last = _group_span(codes, times, n_groups)
            new_reference = _references(codes, times, reference, self.half_life_seconds, new_first, new_last)
            known = ~np.isnan(reference)
            # Re-base what was learned before onto the new reference, as VPA's Scale(2^exponent) does.
            rescale = np.exp2((reference - new_reference) / self.half_life_seconds)
            weights *= np.where(known, rescale, 1.0)[cells // width]
            reference = new_reference
            sample_weights = self.sample_weight * np.exp2((times - reference[codes]) / self.half_life_seconds)
            # Each bucket's new weight summed in the samples' order (as a bincount over every bucket sums it), then
            # added once to what it held.
            new_cells, where = np.unique(codes * width + buckets.find(values), return_inverse=True)
            added = np.bincount(where.reshape(-1), weights=sample_weights, minlength=new_cells.size).astype(
                np.float64, copy=False
            )
            cells, weights = _merged_cells(cells, weights, new_cells, added)
            np.minimum(first, new_first, out=first)
            np.maximum(last, new_last, out=last)
            count += np.bincount(codes, minlength=n_groups)
        self.groups_ = labels
        self.weight_starts_ = np.concatenate([[0], np.cumsum(np.bincount(cells // width, minlength=n_groups))])
        self.weight_buckets_ = cells % width
        self.weight_values_ = weights
        self.reference_timestamp_ = reference
        self.first_sample_ = first
        self.last_sample_ = last
        self.sample_count_ = count
        return self

    def weights(self, rows: IntArray | None = None) -> FloatArray:
        """The (groups x buckets) weights of every group, or of the groups at positions `rows` of `groups_`."""
        check_is_fitted(self, "weight_starts_")
        rows = np.arange(len(self.groups_), dtype=np.int64) if rows is None else rows
        first, counts = self.weight_starts_[rows], np.diff(self.weight_starts_)[rows]
        place = np.repeat(np.arange(rows.size, dtype=np.int64), counts)
        cells = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()), dtype=np.int64)
        weights = np.zeros((rows.size, self.buckets.num_buckets))
        weights[place, self.weight_buckets_[cells]] = self.weight_values_[cells]
        return weights

    def _by_blocks(self, per_block: Callable[[FloatArray], FloatArray]) -> FloatArray:
        """`per_block` of the dense weights of `BLOCK_ROWS` groups at a time, concatenated (every group's value)."""
        blocks = range(0, len(self.groups_), self.BLOCK_ROWS)
        rows = np.arange(len(self.groups_), dtype=np.int64)
        return np.concatenate([per_block(self.weights(rows[b : b + self.BLOCK_ROWS])) for b in blocks] or [np.zeros(0)])

    def quantile(self, q: float) -> FloatArray:
        """VPA's Percentile(q) of every group, in the order of `groups_`: the upper edge of the bucket where the
        cumulative weight (from the first non-empty bucket) reaches q x total; 0 for an empty histogram."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: Sequence[float]) -> list[FloatArray]:
        """`quantile` of each of `qs`, from one pass over the weights (a recommendation reads three of them)."""
        check_is_fitted(self, "weight_starts_")
        for q in qs:
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantile must be within [0, 1], got {q}")
        if not len(self.groups_):
            return [np.zeros(0) for _ in qs]
        table = self._by_blocks(lambda weights: self._quantiles(weights, qs))
        return [table[:, i] for i in range(len(qs))]

    def _quantiles(self, weights: FloatArray, qs: Sequence[float]) -> FloatArray:
        """(groups x qs) quantiles of dense weights: the cumulative weights once, each q's bucket from them."""
        n_buckets = weights.shape[1]
        valid = weights >= self.epsilon
        non_empty = valid.any(axis=1)
        min_bucket = np.argmax(valid, axis=1)
        max_bucket = n_buckets - 1 - np.argmax(valid[:, ::-1], axis=1)
        index = np.arange(n_buckets)
        in_range = (index >= min_bucket[:, None]) & (index <= max_bucket[:, None])
        cumulative = np.cumsum(np.where(in_range, weights, 0.0), axis=1)
        total = weights.sum(axis=1)[:, None]
        below_max = in_range & (index < max_bucket[:, None])
        starts = self.buckets.starts
        result: FloatArray = np.empty((weights.shape[0], len(qs)))
        for i, q in enumerate(qs):
            reached = (cumulative >= q * total) & below_max
            bucket = np.where(reached.any(axis=1), np.argmax(reached, axis=1), max_bucket)
            upper_edge = np.where(bucket < n_buckets - 1, starts[np.minimum(bucket + 1, n_buckets - 1)], starts[bucket])
            result[:, i] = np.where(non_empty, upper_edge, 0.0)
        return result

    def recent_samples(self) -> FloatArray:
        """Each group's samples counted by weight: each is halved per `half_life_seconds` of age before the group's
        newest sample (which counts 1). Evidence a container still behaves so: a history that stopped weeks ago and
        resumed with one sample counts about 1, not the old history's length."""
        check_is_fitted(self, "weight_starts_")
        seen = np.isfinite(self.last_sample_)
        count: FloatArray = np.zeros(len(self.groups_))
        count[seen] = (
            self._by_blocks(lambda weights: weights.sum(axis=1))[seen]
            / self.sample_weight
            * np.exp2((self.reference_timestamp_[seen] - self.last_sample_[seen]) / self.half_life_seconds)
        )
        return count

    def history_days(self) -> FloatArray:
        """Time between each group's first and last sample, days."""
        check_is_fitted(self, "weight_starts_")
        span: FloatArray = np.maximum(self.last_sample_ - self.first_sample_, 0.0) / 86400.0
        return span


Coded = tuple[IntArray, npt.NDArray[np.object_]]


def _coded(column: pd.Series) -> Coded:
    """A label column as integer codes and its distinct labels (Python strings); a categorical one through its
    categories, others factorized once (no per-row string objects)."""
    codes, labels = factorize_groups(column)
    return codes, np.asarray(labels, dtype=object)


def _level(index: pd.Index, level: int) -> Coded:
    """Level `level` of a MultiIndex, coded."""
    assert isinstance(index, pd.MultiIndex)
    codes: IntArray = np.asarray(index.codes[level], dtype=np.int64)
    return codes, np.asarray(index.levels[level].astype(str), dtype=object)


def _unite(parts: list[Coded]) -> Coded:
    """Coded columns concatenated into one code space (only their distinct labels are hashed)."""
    mapping, labels = pd.factorize(np.concatenate([names for _, names in parts]))
    codes, offset = [], 0
    for found, names in parts:
        codes.append(mapping[offset : offset + len(names)][found] if len(found) else found)
        offset += len(names)
    return np.concatenate(codes).astype(np.int64), np.asarray(labels, dtype=object)


def _floats(column: pd.Series) -> FloatArray:
    values: FloatArray = column.to_numpy(dtype=np.float64)
    return values


def _ranks(labels: npt.NDArray[np.object_]) -> IntArray:
    """Each label's place in sorted order (the order a sorted index puts them in)."""
    ranks = np.empty(len(labels), dtype=np.int64)
    ranks[np.argsort(labels, kind="stable")] = np.arange(len(labels))
    return ranks


def _sorted_level(labels: npt.NDArray[np.object_], ranks: IntArray) -> pd.Index:
    """The labels as an index level in sorted order (`ranks` from `_ranks`)."""
    ordered = np.empty(len(labels), dtype=object)
    ordered[ranks] = labels
    return pd.Index(ordered, dtype="str")


def _multi_index(levels: list[pd.Index], codes: list[IntArray], names: list[str]) -> pd.MultiIndex:
    """A MultiIndex of levels and codes already right (sorted, unique levels; codes within them)."""
    return pd.MultiIndex(levels=levels, codes=codes, names=names, verify_integrity=False)  # type: ignore[arg-type]


def _first_of_each(keys: IntArray) -> tuple[IntArray, IntArray]:
    """Codes of the keys in order of first appearance, and the position of each code's first appearance."""
    codes, uniques = pd.factorize(keys)
    firsts = np.empty(len(uniques), dtype=np.int64)
    firsts[codes[::-1]] = np.arange(len(keys) - 1, -1, -1)
    return codes.astype(np.int64), firsts


@dataclass(frozen=True)
class _PeakTable:
    """The kept peaks (`peaks_`) as columns."""

    group: Coded
    pod: Coded
    window_end: FloatArray
    value: FloatArray

    @classmethod
    def of(cls, peaks: pd.Series) -> _PeakTable:
        index = peaks.index
        assert isinstance(index, pd.MultiIndex)
        ends: FloatArray = np.asarray(index.get_level_values(2), dtype=np.float64)
        return cls(_level(index, 0), _level(index, 1), ends, _floats(peaks))

    @classmethod
    def empty(cls) -> _PeakTable:
        none: Coded = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object))
        return cls(none, none, np.zeros(0), np.zeros(0))


class MemoryPeakHistogram(BaseEstimator):  # type: ignore[misc]
    """VPA's memory model: per pod, the peak of each aggregation interval enters a decaying histogram once.

    Intervals are anchored at each pod's first sample, a peak is dated at its interval's end, and only the newest
    `interval_count` intervals of a group are kept. OOM kills, when given, add a sample of
    max(usage + oom_min_bump_bytes, usage x oom_bump_ratio) at the time of the kill.
    Fit on a frame with columns `group`, `pod`, `timestamp`, `value` (bytes); `oom_events` has `group`, `pod`,
    `timestamp`, `value` (the memory in use when the pod was killed).
    """

    peaks_: pd.Series[float]
    pod_origin_: pd.Series[float]
    histogram_: DecayingHistogram

    def __init__(
        self,
        first_bucket_size: float = 1e7,
        max_value: float = 1e12,
        bucket_growth_ratio: float = 0.05,
        half_life_seconds: float = 86400.0,
        peak_weight: float = 1.0,
        epsilon: float = 1e-4,
        interval_seconds: float = 86400.0,
        interval_count: int = 8,
        oom_min_bump_bytes: float = 100 * 1024**2,
        oom_bump_ratio: float = 1.2,
    ) -> None:
        self.first_bucket_size = first_bucket_size
        self.max_value = max_value
        self.bucket_growth_ratio = bucket_growth_ratio
        self.half_life_seconds = half_life_seconds
        self.peak_weight = peak_weight
        self.epsilon = epsilon
        self.interval_seconds = interval_seconds
        self.interval_count = interval_count
        self.oom_min_bump_bytes = oom_min_bump_bytes
        self.oom_bump_ratio = oom_bump_ratio

    def fit(self, X: pd.DataFrame, y: Any = None, oom_events: pd.DataFrame | None = None) -> Self:
        for name in ("peaks_", "pod_origin_", "histogram_"):
            if hasattr(self, name):
                delattr(self, name)
        return self.partial_fit(X, oom_events=oom_events)

    def partial_fit(self, X: pd.DataFrame, y: Any = None, oom_events: pd.DataFrame | None = None) -> Self:
        """Continue with more samples: the peaks of their windows (a window already kept keeps the larger peak), the
        newest `interval_count` windows of each group, and the decaying histogram of those, refitted."""
        name = type(self).__name__
        require_columns(X, ("group", "pod", "timestamp", "value"), name)
        values = X["value"].to_numpy(dtype=np.float64)
        known = ~np.isnan(values)
        every = bool(known.all())

        def sampled(column: pd.Series) -> Coded:
            codes, names = _coded(column)
            return (codes if every else codes[known]), names

        groups, pods = [sampled(X["group"])], [sampled(X["pod"])]
        sample_times, sample_values = [_floats(X["timestamp"])[known]], [values[known]]
        if oom_events is not None and len(oom_events):
            require_columns(oom_events, ("group", "pod", "timestamp", "value"), name + " oom_events")
            used = _floats(oom_events["value"])
            groups.append(_coded(oom_events["group"]))
            pods.append(_coded(oom_events["pod"]))
            sample_times.append(_floats(oom_events["timestamp"]))
            sample_values.append(np.maximum(used + self.oom_min_bump_bytes, used * self.oom_bump_ratio))
        times, values = np.concatenate(sample_times), np.concatenate(sample_values)
        old = _PeakTable.of(self.peaks_) if hasattr(self, "peaks_") else _PeakTable.empty()
        origins = getattr(self, "pod_origin_", None)
        if origins is None:
            origins = pd.Series(np.zeros(0), index=pd.MultiIndex.from_arrays([[], []], names=["group", "pod"]))
        old_origin = origins.to_numpy(dtype=np.float64)
        # One code space for the groups and pods of the old peaks, the known pods and the new samples.
        group_codes, group_labels = _unite([old.group, _level(origins.index, 0), *groups])
        pod_codes, pod_labels = _unite([old.pod, _level(origins.index, 1), *pods])
        pair_ids, pair_keys = pd.factorize(group_codes.astype(np.int64) * max(len(pod_labels), 1) + pod_codes)
        n_peaks, n_known = len(old.value), len(old_origin)
        old_rows, sample_rows = slice(0, n_peaks), slice(n_peaks + n_known, None)
        # A pod's origin: its known one, else its first sample now (a pod's windows are anchored once).
        origin = np.full(len(pair_keys), np.inf)
        np.minimum.at(origin, pair_ids[sample_rows], times)
        origin[pair_ids[n_peaks : n_peaks + n_known]] = old_origin
        sample_origin = origin[pair_ids[sample_rows]]
        window = np.floor((times - sample_origin) / self.interval_seconds)
        window_end = sample_origin + (window + 1) * self.interval_seconds
        # Each (pod, window end)'s peak, the old ones first in their order, then new windows as they come.
        ends = np.concatenate([old.window_end, window_end])
        end_codes, end_values = pd.factorize(ends)
        key_codes, key_firsts = _first_of_each(
            np.concatenate([pair_ids[old_rows], pair_ids[sample_rows]]).astype(np.int64) * max(len(end_values), 1)
            + end_codes
        )
        peak = np.full(len(key_firsts), -np.inf)
        np.maximum.at(peak, key_codes, np.concatenate([old.value, values]))
        peak_group = np.concatenate([group_codes[old_rows], group_codes[sample_rows]])[key_firsts]
        peak_pod = np.concatenate([pod_codes[old_rows], pod_codes[sample_rows]])[key_firsts]
        peak_end = ends[key_firsts]
        newest = np.full(len(group_labels), -np.inf)
        np.maximum.at(newest, peak_group, peak_end)
        kept = peak_end > newest[peak_group] - self.interval_count * self.interval_seconds
        peak_group, peak_pod, peak_end, peak = peak_group[kept], peak_pod[kept], peak_end[kept], peak[kept]
        group_names, pod_names = group_labels, pod_labels
        group_rank, pod_rank = _ranks(group_names), _ranks(pod_names)
        order = np.lexsort((peak_end, pod_rank[peak_pod], group_rank[peak_group]))
        # Indexes built from sorted levels and codes: no per-row strings (the levels' order is the sort's).
        group_level, pod_level = _sorted_level(group_names, group_rank), _sorted_level(pod_names, pod_rank)
        ends, end_codes = np.unique(peak_end[order], return_inverse=True)
        self.peaks_ = pd.Series(
            peak[order],
            index=_multi_index(
                [group_level, pod_level, pd.Index(ends)],
                [group_rank[peak_group[order]], pod_rank[peak_pod[order]], end_codes],
                ["group", "pod", "window_end"],
            ),
            name="value",
            dtype=np.float64,
        )
        pair_group, pair_pod = pair_keys // max(len(pod_labels), 1), pair_keys % max(len(pod_labels), 1)
        by_pod = np.lexsort((pod_rank[pair_pod], group_rank[pair_group]))
        by_pod = by_pod[np.isfinite(origin[by_pod])]
        self.pod_origin_ = pd.Series(
            origin[by_pod],
            index=_multi_index(
                [group_level, pod_level],
                [group_rank[pair_group[by_pod]], pod_rank[pair_pod[by_pod]]],
                ["group", "pod"],
            ),
            name="origin",
            dtype=np.float64,
        )
        # The histogram of the kept peaks, fed in the order above (its sums, to the last bit, follow that order).
        local_codes, local_groups = pd.factorize(peak_group)
        self.histogram_ = DecayingHistogram(
            first_bucket_size=self.first_bucket_size,
            max_value=self.max_value,
            bucket_growth_ratio=self.bucket_growth_ratio,
            half_life_seconds=self.half_life_seconds,
            sample_weight=self.peak_weight,
            epsilon=self.epsilon,
        ).add_samples(local_codes.astype(np.int64), pd.Index(group_names[local_groups]).astype(str), peak_end, peak)
        return self

    @property
    def groups_(self) -> npt.NDArray[np.str_]:
        check_is_fitted(self, "histogram_")
        groups: npt.NDArray[np.str_] = self.histogram_.groups_
        return groups

    def quantile(self, q: float) -> FloatArray:
        """VPA percentile of the kept peaks of every group, in the order of `groups_`."""
        check_is_fitted(self, "histogram_")
        return self.histogram_.quantile(q)

    def quantiles(self, qs: Sequence[float]) -> list[FloatArray]:
        """`quantile` of each of `qs`, from one pass over the kept peaks' histogram."""
        check_is_fitted(self, "histogram_")
        return self.histogram_.quantiles(qs)
