"""VPA-compatible decaying exponential histograms, fitted for many groups (workload containers) at once.

The bucket layout, the upper-edge percentile, the epsilon rule and the half-life decay with its re-based reference
timestamp follow the VPA recommender (anchors.md section 2), so a percentile here equals VPA's for the same samples.
All groups share one (groups x buckets) weight matrix, so fitting two million samples is a single `bincount`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from models._validation import factorize_groups, require_columns
from recommender.arrays import FloatArray, IntArray

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
        # One log implementation for both terms, as VPA's Log(x) / Log(base): a value on a boundary lands on it.
        index: IntArray = np.floor(np.log(scaled) / np.log(np.full_like(scaled, ratio))).astype(np.int64)
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
    reference = start.copy()
    horizon = MAX_DECAY_EXPONENT * half_life
    order = np.lexsort((timestamps, group_codes))
    codes, times = group_codes[order], timestamps[order]
    bounds = np.flatnonzero(np.diff(codes)) + 1
    for segment in np.split(np.arange(codes.size), bounds):
        if segment.size == 0:
            continue
        g = codes[segment[0]]
        seg_times = times[segment]
        ref = reference[g]
        if np.isnan(ref):
            ref = _round_half_away(seg_times[0], half_life)
        while seg_times[-1] > ref + horizon:
            first_beyond = seg_times[np.searchsorted(seg_times, ref + horizon, side="right")]
            ref = _round_half_away(first_beyond, half_life)
        reference[g] = ref
    return reference


def _round_half_away(t: float, unit: float) -> float:
    """Go's time.Round: to the nearest multiple of unit, halves away from zero."""
    return float(math.copysign(math.floor(abs(t) / unit + 0.5), t) * unit)


class DecayingHistogram(BaseEstimator):  # type: ignore[misc]
    """Per-group decaying histogram of samples; `quantile(q)` returns VPA's percentile for every group.

    Fit on a frame with columns `group` (any string label), `timestamp` (Unix seconds) and `value`; rows with a
    missing value are skipped. `partial_fit` continues from the learned state, giving the same weights as one fit
    on all the samples (the decay is exact), which is what makes incremental training possible.
    """

    groups_: npt.NDArray[np.str_]
    weights_: FloatArray
    reference_timestamp_: FloatArray
    first_sample_: FloatArray
    last_sample_: FloatArray
    sample_count_: IntArray

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

    @property
    def buckets(self) -> ExponentialBuckets:
        return ExponentialBuckets(self.first_bucket_size, self.max_value, self.bucket_growth_ratio)

    def fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        for name in ("groups_", "weights_", "reference_timestamp_", "first_sample_", "last_sample_", "sample_count_"):
            if hasattr(self, name):
                delattr(self, name)
        return self.partial_fit(X)

    def partial_fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        require_columns(X, ("group", "timestamp", "value"), type(self).__name__)
        frame = X.loc[X["value"].notna(), ["group", "timestamp", "value"]]
        values = frame["value"].to_numpy(dtype=np.float64)
        if np.any(values < 0) or not np.all(np.isfinite(values)):
            raise ValueError("histogram samples must be finite and non-negative")
        buckets = self.buckets
        previous = list(self.groups_) if hasattr(self, "groups_") else []
        local_codes, local_labels = factorize_groups(frame["group"])
        labels = pd.Index(previous, dtype=object).append(local_labels).unique()
        n_groups = len(labels)
        weights = np.zeros((n_groups, buckets.num_buckets))
        reference = np.full(n_groups, np.nan)
        first = np.full(n_groups, np.inf)
        last = np.full(n_groups, -np.inf)
        count = np.zeros(n_groups, dtype=np.int64)
        if previous:
            k = len(previous)
            weights[:k], reference[:k] = self.weights_, self.reference_timestamp_
            first[:k], last[:k], count[:k] = self.first_sample_, self.last_sample_, self.sample_count_
        codes = labels.get_indexer(local_labels).astype(np.int64)[local_codes]
        times = frame["timestamp"].to_numpy(dtype=np.float64)
        if codes.size:
            new_reference = vpa_reference_timestamps(codes, times, reference, self.half_life_seconds)
            known = ~np.isnan(reference)
            # Re-base what was learned before onto the new reference, as VPA's Scale(2^exponent) does.
            weights[known] *= np.exp2((reference[known] - new_reference[known]) / self.half_life_seconds)[:, None]
            reference = new_reference
            sample_weights = self.sample_weight * np.exp2((times - reference[codes]) / self.half_life_seconds)
            flat = codes * buckets.num_buckets + buckets.find(values)
            weights += np.bincount(flat, weights=sample_weights, minlength=weights.size).reshape(weights.shape)
            np.minimum.at(first, codes, times)
            np.maximum.at(last, codes, times)
            count += np.bincount(codes, minlength=n_groups)
        self.groups_ = np.asarray(labels, dtype=str)
        self.weights_ = weights
        self.reference_timestamp_ = reference
        self.first_sample_ = first
        self.last_sample_ = last
        self.sample_count_ = count
        return self

    def quantile(self, q: float) -> FloatArray:
        """VPA's Percentile(q) of every group, in the order of `groups_`: the upper edge of the bucket where the
        cumulative weight (from the first non-empty bucket) reaches q x total; 0 for an empty histogram."""
        check_is_fitted(self, "weights_")
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
        weights = self.weights_
        n_buckets = weights.shape[1]
        if weights.shape[0] == 0:
            return np.zeros(0)
        valid = weights >= self.epsilon
        non_empty = valid.any(axis=1)
        min_bucket = np.argmax(valid, axis=1)
        max_bucket = n_buckets - 1 - np.argmax(valid[:, ::-1], axis=1)
        index = np.arange(n_buckets)
        in_range = (index >= min_bucket[:, None]) & (index <= max_bucket[:, None])
        cumulative = np.cumsum(np.where(in_range, weights, 0.0), axis=1)
        reached = (cumulative >= q * weights.sum(axis=1)[:, None]) & in_range & (index < max_bucket[:, None])
        bucket = np.where(reached.any(axis=1), np.argmax(reached, axis=1), max_bucket)
        starts = self.buckets.starts
        upper_edge = np.where(bucket < n_buckets - 1, starts[np.minimum(bucket + 1, n_buckets - 1)], starts[bucket])
        result: FloatArray = np.where(non_empty, upper_edge, 0.0)
        return result

    def history_days(self) -> FloatArray:
        """Time between each group's first and last sample, days."""
        check_is_fitted(self, "weights_")
        span: FloatArray = np.maximum(self.last_sample_ - self.first_sample_, 0.0) / 86400.0
        return span


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
        name = type(self).__name__
        require_columns(X, ("group", "pod", "timestamp", "value"), name)
        samples = X.loc[X["value"].notna(), ["group", "pod", "timestamp", "value"]]
        if oom_events is not None and len(oom_events):
            require_columns(oom_events, ("group", "pod", "timestamp", "value"), name + " oom_events")
            used = oom_events["value"].astype(np.float64)
            bumped = np.maximum(used + self.oom_min_bump_bytes, used * self.oom_bump_ratio)
            samples = pd.concat([samples, oom_events[["group", "pod", "timestamp"]].assign(value=bumped)])
        samples = samples.astype({"timestamp": np.float64, "value": np.float64})
        samples["group"] = samples["group"].astype(str)
        samples["pod"] = samples["pod"].astype(str)
        origin = samples.groupby(["group", "pod"], sort=False)["timestamp"].min().rename("origin")
        if hasattr(self, "pod_origin_"):
            origin = self.pod_origin_.combine_first(origin)
        samples = samples.join(origin, on=["group", "pod"])
        window = np.floor((samples["timestamp"] - samples["origin"]) / self.interval_seconds)
        samples["window_end"] = samples["origin"] + (window + 1) * self.interval_seconds
        peak_series = samples.groupby(["group", "pod", "window_end"], sort=False)["value"].max()
        if hasattr(self, "peaks_"):
            peak_series = pd.concat([self.peaks_, peak_series]).groupby(level=[0, 1, 2], sort=False).max()
        peaks = peak_series.reset_index()
        newest = peaks.groupby("group")["window_end"].transform("max")
        kept = peaks[peaks["window_end"] > newest - self.interval_count * self.interval_seconds]
        self.pod_origin_ = origin
        self.peaks_ = kept.set_index(["group", "pod", "window_end"])["value"].sort_index()
        self.histogram_ = DecayingHistogram(
            first_bucket_size=self.first_bucket_size,
            max_value=self.max_value,
            bucket_growth_ratio=self.bucket_growth_ratio,
            half_life_seconds=self.half_life_seconds,
            sample_weight=self.peak_weight,
            epsilon=self.epsilon,
        ).fit(kept.rename(columns={"window_end": "timestamp"}))
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
