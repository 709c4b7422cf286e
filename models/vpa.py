"""The `vpa` request policy: the Kubernetes VPA recommender (v1.5.1) reproduced sample by sample.

`models/histogram.py` fits VPA-style histograms for the whole fleet at once; this module keeps VPA's own state
machine instead, because its results depend on the order of events: a pod container's memory peak per aggregation
window (replaced by subtracting the old peak and adding the new one), OOM kills bumped from max(request, the
window's peak) and refused when older than the window, CPU samples refused when not newer than the previous one,
decaying histograms whose reference time moves, whole millicores and bytes after every estimator step, confidence
from 1-minute sample counting with no floor (so +Inf / 0 before any history), and checkpoints in VPA's v3 format.
What VPA does is restated in the docstrings; `tests/unit/test_vpa.py` holds its unit tests' expectations as tables.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from models._validation import require_columns
from models.histogram import MAX_DECAY_EXPONENT, ExponentialBuckets, LinearBuckets
from recommender.arrays import FloatArray

#: VPA's ResourceAmount ceiling (millicores or bytes).
MAX_RESOURCE_AMOUNT = 10**14
#: What Go's int64(NaN) gives on amd64, where VPA runs: the most negative int64 (a later max() with the minimum wins).
GO_NAN_INT64 = -(2**63)
#: Largest bucket weight in a checkpoint; the others are scaled to it and rounded.
MAX_CHECKPOINT_WEIGHT = 10000
CHECKPOINT_VERSION = "v3"
#: Seconds from Go's zero time (0001-01-01 UTC) to the Unix epoch: time.Round counts multiples from the zero time.
GO_ZERO_TIME_OFFSET = 62135596800
#: VPA's confidence counts samples as if one came every minute.
SAMPLES_PER_MINUTE_SECONDS = 60.0

Layout = ExponentialBuckets | LinearBuckets


def amount(value: float) -> int:
    """VPA's resourceAmountFromFloat: truncated to an integer, negative -> 0, above 1e14 -> 1e14, NaN -> Go's int64."""
    if value != value:
        return GO_NAN_INT64
    if value < 0:
        return 0
    if value > MAX_RESOURCE_AMOUNT:
        return MAX_RESOURCE_AMOUNT
    return int(value)


def cpu_millicores(cpu_cores: float) -> int:
    return amount(cpu_cores * 1000.0)


def scale_amount(value: int, factor: float) -> int:
    """VPA's ScaleResource: the product truncated again."""
    return amount(float(value) * factor)


def go_round(t: float, unit: float) -> float:
    """Go's time.Round(unit) of a Unix time: the nearest multiple of unit since Go's zero time, halves up."""
    since_zero = t + GO_ZERO_TIME_OFFSET
    return float(math.floor(since_zero / unit + 0.5) * unit - GO_ZERO_TIME_OFFSET)


def _amounts(values: FloatArray) -> npt.NDArray[np.int64]:
    """`amount` of many finite values at once."""
    result: npt.NDArray[np.int64] = np.trunc(np.clip(values, 0.0, float(MAX_RESOURCE_AMOUNT))).astype(np.int64)
    return result


def _find(layout: Layout, value: float) -> int:
    return int(layout.find(np.array([value], dtype=np.float64))[0])


@dataclass
class Histogram:
    """VPA's histogram: bucket weights, their total and the first / last bucket holding at least epsilon.

    `percentile(p)` accumulates from the first such bucket and returns the end of the bucket where the sum reaches
    p x total (the start of the last bucket, which has no end); p outside [0, 1] simply stops at the first or last
    bucket; an empty histogram gives 0. Subtracting floors a bucket (and the total) at 0 once below epsilon.
    """

    layout: Layout
    epsilon: float
    weights: FloatArray = field(init=False)
    total: float = field(init=False, default=0.0)
    min_bucket: int = field(init=False)
    max_bucket: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.weights = np.zeros(self.layout.num_buckets)
        self.min_bucket = self.layout.num_buckets - 1

    def add(self, value: float, weight: float) -> None:
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        self._add_to(_find(self.layout, value), weight)

    def _add_to(self, bucket: int, weight: float) -> None:
        self.weights[bucket] += weight
        self.total += weight
        if self.weights[bucket] >= self.epsilon:
            self.min_bucket = min(self.min_bucket, bucket)
            self.max_bucket = max(self.max_bucket, bucket)

    def add_many(self, values: FloatArray, weights: FloatArray) -> None:
        """The same as `add` for each (value, weight) in order: per-bucket and total sums are sequential, and a
        bucket that reaches epsilon stays there (weights only grow), so its final weight decides the range."""
        if values.size == 0:
            return
        buckets = self.layout.find(values)
        np.add.at(self.weights, buckets, weights)
        self.total = float(np.cumsum(np.concatenate(([self.total], weights)))[-1])
        touched = np.unique(buckets)
        kept = touched[self.weights[touched] >= self.epsilon]
        if kept.size:
            self.min_bucket = min(self.min_bucket, int(kept[0]))
            self.max_bucket = max(self.max_bucket, int(kept[-1]))

    def subtract(self, value: float, weight: float) -> None:
        if weight < 0:
            raise ValueError("sample weight must be non-negative")
        bucket = _find(self.layout, value)
        self.total = _floored(self.total - weight, self.epsilon)
        self.weights[bucket] = _floored(self.weights[bucket] - weight, self.epsilon)
        self._update_range()

    def merge(self, other: Histogram) -> None:
        if other.layout != self.layout or other.epsilon != self.epsilon:
            raise ValueError("can't merge histograms with different bucket layouts")
        if other.min_bucket <= other.max_bucket:
            span = slice(other.min_bucket, other.max_bucket + 1)
            self.weights[span] += other.weights[span]
        self.total += other.total
        self.min_bucket = min(self.min_bucket, other.min_bucket)
        self.max_bucket = max(self.max_bucket, other.max_bucket)

    def is_empty(self) -> bool:
        return bool(self.weights[self.min_bucket] < self.epsilon)

    def percentile(self, p: float) -> float:
        if self.is_empty():
            return 0.0
        threshold = p * self.total
        partial = 0.0
        bucket = self.min_bucket
        while bucket < self.max_bucket:
            partial += float(self.weights[bucket])
            if partial >= threshold:
                break
            bucket += 1
        starts = self.layout.starts
        return float(starts[bucket + 1] if bucket < self.layout.num_buckets - 1 else starts[bucket])

    def scale(self, factor: float) -> None:
        if factor < 0:
            raise ValueError("scale factor must be non-negative")
        span = slice(self.min_bucket, self.max_bucket + 1)
        self.weights[span] *= factor
        self.total *= factor
        self._update_range()

    def _update_range(self) -> None:
        last = self.layout.num_buckets - 1
        while self.weights[self.min_bucket] < self.epsilon and self.min_bucket < last:
            self.min_bucket += 1
        while self.weights[self.max_bucket] < self.epsilon and self.max_bucket > 0:
            self.max_bucket -= 1

    def to_checkpoint(self) -> dict[str, Any]:
        """VPA's HistogramCheckpoint: the total and each bucket's weight scaled so the largest is 10000, rounded
        half up, zeros left out (keys are strings, as in the object's JSON)."""
        span = self.weights[self.min_bucket : self.max_bucket + 1]
        largest = float(span.max()) if span.size else 0.0
        buckets: dict[str, int] = {}
        if largest > 0:
            ratio = MAX_CHECKPOINT_WEIGHT / largest
            for offset, weight in enumerate(span.tolist()):
                scaled = int(math.floor(weight * ratio + 0.5))
                if scaled > 0:
                    buckets[str(self.min_bucket + offset)] = scaled
        return {"bucketWeights": buckets, "totalWeight": self.total}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add a HistogramCheckpoint's weights: each integer weight x totalWeight / (sum of the integers)."""
        if not isinstance(checkpoint, dict):
            raise ValueError(f"no checkpoint to load (got {type(checkpoint).__name__})")
        total = float(checkpoint.get("totalWeight") or 0.0)
        if total < 0:
            raise ValueError(f"checkpoint has a negative totalWeight {total}")
        weights = {int(bucket): int(weight) for bucket, weight in (checkpoint.get("bucketWeights") or {}).items()}
        for bucket, weight in weights.items():
            if not 0 <= bucket < self.layout.num_buckets:
                raise ValueError(f"checkpoint bucket {bucket} is outside the {self.layout.num_buckets} buckets")
            if not 0 <= weight < 2**32:
                raise ValueError(f"checkpoint bucket {bucket} has weight {weight}, not a uint32")
        count = sum(weights.values())
        if count == 0:
            return
        ratio = total / count
        for bucket, weight in weights.items():
            self.min_bucket = min(self.min_bucket, bucket)
            self.max_bucket = max(self.max_bucket, bucket)
            self.weights[bucket] += weight * ratio
        self.total += total
        self._update_range()


def _floored(value: float, epsilon: float) -> float:
    return 0.0 if value < epsilon else value


@dataclass
class DecayingHistogram(Histogram):
    """VPA's decaying histogram: a sample weighs w x 2^((t - reference) / half_life). The reference is a multiple of
    the half-life; when a sample comes more than 100 half-lives after it, it moves to that sample's time (rounded)
    and the weights are scaled by the power of two between them. `reference` None is Go's zero time."""

    half_life_seconds: float = 86400.0
    reference: float | None = None

    def _shift_reference(self, to: float) -> None:
        new = go_round(to, self.half_life_seconds)
        old = -float(GO_ZERO_TIME_OFFSET) if self.reference is None else self.reference
        exponent = math.floor((old - new) / self.half_life_seconds + 0.5)
        self.scale(math.ldexp(1.0, max(exponent, -1100)))
        self.reference = new

    def decay_factor(self, t: float) -> float:
        reference = -float(GO_ZERO_TIME_OFFSET) if self.reference is None else self.reference
        if t > reference + MAX_DECAY_EXPONENT * self.half_life_seconds:
            self._shift_reference(t)
            reference = float(self.reference)  # type: ignore[arg-type]
        return float(np.exp2((t - reference) / self.half_life_seconds))

    def add_at(self, value: float, weight: float, t: float) -> None:
        self.add(value, weight * self.decay_factor(t))

    def subtract_at(self, value: float, weight: float, t: float) -> None:
        self.subtract(value, weight * self.decay_factor(t))

    def add_many_at(self, values: FloatArray, weight: float, times: FloatArray) -> None:
        """`add_at` for samples in time order, vectorised between the (rare) moves of the reference."""
        start = 0
        while start < values.size:
            self.decay_factor(float(times[start]))
            reference = float(self.reference)  # type: ignore[arg-type]
            end = int(np.searchsorted(times, reference + MAX_DECAY_EXPONENT * self.half_life_seconds, side="right"))
            end = max(end, start + 1)
            factors = np.exp2((times[start:end] - reference) / self.half_life_seconds)
            self.add_many(values[start:end], weight * factors)
            start = end

    def merge_decaying(self, other: DecayingHistogram) -> None:
        """VPA's merge: the histogram with the older reference is moved to the younger one first (that may be
        `other`, which VPA also changes), then the weights are added."""
        if other.half_life_seconds != self.half_life_seconds:
            raise ValueError("can't merge decaying histograms with different half-lives")
        mine = -float(GO_ZERO_TIME_OFFSET) if self.reference is None else self.reference
        theirs = -float(GO_ZERO_TIME_OFFSET) if other.reference is None else other.reference
        if mine < theirs:
            self._shift_reference(theirs)
        elif theirs < mine:
            other._shift_reference(mine)
        self.merge(other)

    def to_checkpoint(self) -> dict[str, Any]:
        checkpoint = super().to_checkpoint()
        checkpoint["referenceTimestamp"] = _rfc3339(self.reference)
        return checkpoint

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().load_checkpoint(checkpoint)
        self.reference = _parse_time(checkpoint.get("referenceTimestamp"))


def _rfc3339(t: float | None) -> str | None:
    """metav1.Time's JSON: whole seconds, UTC, or null for the zero time."""
    if t is None:
        return None
    return datetime.fromtimestamp(math.floor(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> float | None:
    if text in (None, ""):
        return None
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ValueError(f"timestamp {text!r} is not RFC 3339 UTC (2006-01-02T15:04:05Z)") from None


@dataclass
class AggregateState:
    """VPA's AggregateContainerState: the CPU histogram, the memory-peak histogram, and the first / last CPU
    sample and CPU sample count (memory does not count) that the confidence is read from."""

    cpu: DecayingHistogram
    memory: DecayingHistogram
    created: float
    first_sample: float | None = None
    last_sample: float | None = None
    samples: int = 0

    def merge(self, other: AggregateState) -> None:
        self.cpu.merge_decaying(other.cpu)
        self.memory.merge_decaying(other.memory)
        if other.first_sample is not None and (self.first_sample is None or other.first_sample < self.first_sample):
            self.first_sample = other.first_sample
        if other.last_sample is not None and (self.last_sample is None or other.last_sample > self.last_sample):
            self.last_sample = other.last_sample
        self.samples += other.samples

    def is_expired(self, now: float, window_seconds: float) -> bool:
        """VPA's garbage collection: no CPU sample (or, never one, no creation) within the memory window."""
        since = self.created if self.samples == 0 or self.last_sample is None else self.last_sample
        return now - since >= window_seconds

    def to_checkpoint(self, now: float) -> dict[str, Any]:
        """VerticalPodAutoscalerCheckpoint `status` in the v3 format."""
        return {
            "lastUpdateTime": _rfc3339(now),
            "version": CHECKPOINT_VERSION,
            "cpuHistogram": self.cpu.to_checkpoint(),
            "memoryHistogram": self.memory.to_checkpoint(),
            "firstSampleStart": _rfc3339(self.first_sample),
            "lastSampleStart": _rfc3339(self.last_sample),
            "totalSamplesCount": self.samples,
        }

    def load_checkpoint(self, status: dict[str, Any]) -> None:
        version = status.get("version")
        if version != CHECKPOINT_VERSION:
            raise ValueError(f"unsupported checkpoint version {version!r} (expected {CHECKPOINT_VERSION!r})")
        samples = status.get("totalSamplesCount") or 0
        if not isinstance(samples, int) or samples < 0:
            raise ValueError(f"totalSamplesCount {samples!r} is not a non-negative integer")
        self.samples = samples
        self.first_sample = _parse_time(status.get("firstSampleStart"))
        self.last_sample = _parse_time(status.get("lastSampleStart"))
        self.memory.load_checkpoint(status.get("memoryHistogram") or {})
        self.cpu.load_checkpoint(status.get("cpuHistogram") or {})


@dataclass
class ContainerState:
    """VPA's per pod-container state: the last CPU and memory sample times and the current memory window, whose
    single peak (usage or OOM) lives in the aggregate's memory histogram dated at the window's end."""

    aggregate: AggregateState
    interval_seconds: float
    cpu_weight: float = 0.1
    peak_weight: float = 1.0
    last_cpu: float | None = None
    last_memory: float | None = None
    window_end: float | None = None
    memory_peak: int = 0
    oom_peak: int = 0

    def add_cpu(self, millicores: int, t: float) -> bool:
        """A CPU sample, refused when negative or not after the previous one (duplicates, out of order)."""
        if millicores < 0 or (self.last_cpu is not None and t <= self.last_cpu):
            return False
        self.aggregate.cpu.add_at(millicores / 1000.0, self.cpu_weight, t)
        self._count_cpu(t)
        return True

    def _count_cpu(self, t: float) -> None:
        state = self.aggregate
        state.last_sample = t if state.last_sample is None else max(state.last_sample, t)
        state.first_sample = t if state.first_sample is None else min(state.first_sample, t)
        state.samples += 1
        self.last_cpu = t

    def peak(self) -> int:
        return max(self.memory_peak, self.oom_peak)

    def add_memory(self, memory_bytes: int, t: float, oom: bool = False) -> bool:
        """A memory sample (refused when negative, or, unless an OOM, older than the previous one). A new window
        adds a peak; a larger value in the current window replaces its peak (only once the peak is non-zero)."""
        if memory_bytes < 0 or (not oom and self.last_memory is not None and t < self.last_memory):
            return False
        self.last_memory = t
        if self.window_end is None:
            self.window_end = t
        histogram = self.aggregate.memory
        new_peak = False
        if t < self.window_end:
            old = self.peak()
            if old != 0 and memory_bytes > old:
                histogram.subtract_at(float(old), self.peak_weight, self.window_end)
                new_peak = True
        else:
            skipped = math.floor((t - self.window_end) / self.interval_seconds) * self.interval_seconds
            self.window_end += skipped + self.interval_seconds
            self.memory_peak = self.oom_peak = 0
            new_peak = True
        if new_peak:
            histogram.add_at(float(memory_bytes), self.peak_weight, self.window_end)
            if oom:
                self.oom_peak = memory_bytes
            else:
                self.memory_peak = memory_bytes
        return True

    def record_oom(self, t: float, request_bytes: int, min_bump_bytes: float, bump_ratio: float) -> bool:
        """An OOM kill as a memory sample of max(used + min bump, used x ratio), used = max(the request, this
        window's usage peak); refused when before the current window."""
        if self.window_end is not None and t < self.window_end - self.interval_seconds:
            return False
        used = max(request_bytes, self.memory_peak)
        needed = max(used + amount(min_bump_bytes), scale_amount(used, bump_ratio))
        return self.add_memory(needed, t, oom=True)


@dataclass(frozen=True)
class Bounds:
    """One resource's VPA recommendation, in whole millicores or bytes."""

    target: int
    lower_bound: int
    upper_bound: int


def confidence(state: AggregateState, interval_seconds: float) -> float:
    """VPA's confidence: min(history span, CPU samples counted as one a minute), in confidence intervals."""
    span = 0.0
    if state.first_sample is not None and state.last_sample is not None:
        span = (state.last_sample - state.first_sample) / interval_seconds
    return min(span, state.samples / (interval_seconds / SAMPLES_PER_MINUTE_SECONDS))


def confidence_factor(multiplier: float, exponent: float, days: float) -> float:
    """(1 + multiplier / days) ^ exponent with IEEE division: no history gives +Inf or 0 (Go's math.Pow)."""
    ratio = (
        multiplier / days if days != 0 else (math.inf if multiplier > 0 else math.nan if multiplier == 0 else -math.inf)
    )
    base = 1.0 + ratio
    try:
        return float(math.pow(base, exponent))
    except (OverflowError, ValueError):
        return math.inf if base > 1 else math.nan


class VpaRecommender(BaseEstimator):  # type: ignore[misc]
    """Per workload container (pods pooled, as VPA merges its aggregates by container name), VPA's aggregate state
    fed sample by sample as its recommender would be, and its target / lower / upper bound at a decision time.

    Fit on tidy usage with a `group` column (see `models.workload.with_group_labels`); `oom_events` has `group`,
    `pod`, `timestamp` and `request_bytes` (the killed container's memory request; VPA bumps from it). Samples VPA
    refuses are skipped one by one and counted in `skipped_` by reason. `partial_fit` continues every state; a
    sample older than what a container already took is refused as VPA would. Checkpoints (`checkpoint`,
    `warm_start`) are VerticalPodAutoscalerCheckpoint statuses; a warm start is kept beside the live state and
    merged into it when recommending, as VPA does with the checkpoints it loads at start.
    """

    states_: dict[str, AggregateState]
    containers_: dict[tuple[str, str], ContainerState]
    initial_: dict[str, AggregateState]
    skipped_: Counter[str]

    def __init__(
        self,
        cpu_first_bucket_cores: float = 0.01,
        cpu_max_cores: float = 1000.0,
        memory_first_bucket_bytes: float = 1e7,
        memory_max_bytes: float = 1e12,
        bucket_growth_ratio: float = 0.05,
        epsilon: float = 1e-4,
        cpu_half_life_seconds: float = 86400.0,
        memory_half_life_seconds: float = 86400.0,
        cpu_sample_weight: float = 0.1,
        memory_peak_weight: float = 1.0,
        memory_aggregation_interval_seconds: float = 86400.0,
        memory_aggregation_interval_count: int = 8,
        oom_min_bump_bytes: float = 100 * 1024**2,
        oom_bump_ratio: float = 1.2,
        target_percentile: float = 0.9,
        lower_bound_percentile: float = 0.5,
        upper_bound_percentile: float = 0.95,
        safety_margin_fraction: float = 0.15,
        lower_bound_confidence_multiplier: float = 0.001,
        lower_bound_confidence_exponent: float = -2.0,
        upper_bound_confidence_multiplier: float = 1.0,
        upper_bound_confidence_exponent: float = 1.0,
        confidence_interval_seconds: float = 86400.0,
        pod_min_cpu_cores: float = 0.025,
        pod_min_memory_bytes: float = 250 * 1024**2,
    ) -> None:
        self.cpu_first_bucket_cores = cpu_first_bucket_cores
        self.cpu_max_cores = cpu_max_cores
        self.memory_first_bucket_bytes = memory_first_bucket_bytes
        self.memory_max_bytes = memory_max_bytes
        self.bucket_growth_ratio = bucket_growth_ratio
        self.epsilon = epsilon
        self.cpu_half_life_seconds = cpu_half_life_seconds
        self.memory_half_life_seconds = memory_half_life_seconds
        self.cpu_sample_weight = cpu_sample_weight
        self.memory_peak_weight = memory_peak_weight
        self.memory_aggregation_interval_seconds = memory_aggregation_interval_seconds
        self.memory_aggregation_interval_count = memory_aggregation_interval_count
        self.oom_min_bump_bytes = oom_min_bump_bytes
        self.oom_bump_ratio = oom_bump_ratio
        self.target_percentile = target_percentile
        self.lower_bound_percentile = lower_bound_percentile
        self.upper_bound_percentile = upper_bound_percentile
        self.safety_margin_fraction = safety_margin_fraction
        self.lower_bound_confidence_multiplier = lower_bound_confidence_multiplier
        self.lower_bound_confidence_exponent = lower_bound_confidence_exponent
        self.upper_bound_confidence_multiplier = upper_bound_confidence_multiplier
        self.upper_bound_confidence_exponent = upper_bound_confidence_exponent
        self.confidence_interval_seconds = confidence_interval_seconds
        self.pod_min_cpu_cores = pod_min_cpu_cores
        self.pod_min_memory_bytes = pod_min_memory_bytes

    def new_state(self, created: float) -> AggregateState:
        """An empty aggregate with this estimator's bucket layouts and half-lives."""
        ratio = self.bucket_growth_ratio
        cpu = ExponentialBuckets(self.cpu_first_bucket_cores, self.cpu_max_cores, ratio)
        memory = ExponentialBuckets(self.memory_first_bucket_bytes, self.memory_max_bytes, ratio)
        return AggregateState(
            cpu=DecayingHistogram(cpu, self.epsilon, half_life_seconds=self.cpu_half_life_seconds),
            memory=DecayingHistogram(memory, self.epsilon, half_life_seconds=self.memory_half_life_seconds),
            created=created,
        )

    def fit(self, X: pd.DataFrame, y: Any = None, oom_events: pd.DataFrame | None = None) -> Self:
        self.states_, self.containers_, self.initial_, self.skipped_ = {}, {}, {}, Counter()
        return self.partial_fit(X, oom_events=oom_events)

    def partial_fit(self, X: pd.DataFrame, y: Any = None, oom_events: pd.DataFrame | None = None) -> Self:
        """Feed samples (and OOM kills) per pod container in time order, CPU and memory as separate streams."""
        if not hasattr(self, "states_"):
            self.states_, self.containers_, self.initial_, self.skipped_ = {}, {}, {}, Counter()
        require_columns(X, ("group", "pod", "timestamp", "cpu_cores", "memory_bytes"), type(self).__name__)
        if len(X) == 0 and (oom_events is None or len(oom_events) == 0):
            return self  # nothing to feed (the `forecast` policy's containers are not VPA's)
        frame = pd.DataFrame(
            {
                "group": X["group"].astype(str).to_numpy(),
                "pod": X["pod"].astype(str).to_numpy(),
                "timestamp": X["timestamp"].to_numpy(dtype=np.float64),
                "cpu": X["cpu_cores"].to_numpy(dtype=np.float64),
                "memory": X["memory_bytes"].to_numpy(dtype=np.float64),
            }
        ).sort_values(["group", "pod", "timestamp"], kind="stable")
        ooms = self._ooms(oom_events)
        for group, rows in frame.groupby("group", sort=False):
            pods = [
                (
                    self._container(str(group), str(pod), float(own["timestamp"].iloc[0])),
                    own,
                    ooms.pop((str(group), str(pod)), None),
                )
                for pod, own in rows.groupby("pod", sort=False)
            ]
            self._feed_cpu(pods)
            self._feed_memory(pods)
        for (group, pod), events in ooms.items():  # kills of pods without samples here
            self._feed_memory(
                [(self._container(group, pod, float(events["timestamp"].iloc[0])), frame.iloc[:0], events)]
            )
        return self

    def _container(self, group: str, pod: str, first: float) -> ContainerState:
        if group not in self.states_:
            self.states_[group] = self.new_state(first)
        key = (group, pod)
        if key not in self.containers_:
            self.containers_[key] = ContainerState(
                self.states_[group],
                self.memory_aggregation_interval_seconds,
                self.cpu_sample_weight,
                self.memory_peak_weight,
            )
        return self.containers_[key]

    @staticmethod
    def _ooms(oom_events: pd.DataFrame | None) -> dict[tuple[str, str], pd.DataFrame]:
        if oom_events is None or len(oom_events) == 0:
            return {}
        require_columns(oom_events, ("group", "pod", "timestamp", "request_bytes"), "VpaRecommender oom_events")
        events = oom_events.assign(group=oom_events["group"].astype(str), pod=oom_events["pod"].astype(str))
        return {(str(group), str(pod)): rows for (group, pod), rows in events.groupby(["group", "pod"], sort=False)}

    def _feed_cpu(self, pods: list[tuple[ContainerState, pd.DataFrame, pd.DataFrame | None]]) -> None:
        """CPU samples as whole millicores (VPA's CPUAmountFromCores), refused per pod when not after its previous
        one, and added to the workload's histogram in time order across its pods, as VPA's feeder adds them."""
        values, times = [], []
        for container, rows, _ in pods:
            cores = rows["cpu"].to_numpy()
            known = ~np.isnan(cores)
            moments = rows["timestamp"].to_numpy()[known]
            keep = np.concatenate(([True], np.diff(moments) > 0)) if moments.size else np.zeros(0, dtype=bool)
            if container.last_cpu is not None:
                keep &= moments > container.last_cpu
            self.skipped_["cpu not after the previous sample"] += int(moments.size - keep.sum())
            if keep.any():
                values.append(_amounts(cores[known][keep] * 1000.0) / 1000.0)
                times.append(moments[keep])
                container.last_cpu = float(moments[keep][-1])
        if not times:
            return
        all_times = np.concatenate(times)
        order = np.argsort(all_times, kind="stable")
        state = pods[0][0].aggregate
        state.cpu.add_many_at(np.concatenate(values)[order], pods[0][0].cpu_weight, all_times[order])
        first, last = float(all_times[order[0]]), float(all_times[order[-1]])
        state.first_sample = first if state.first_sample is None else min(state.first_sample, first)
        state.last_sample = last if state.last_sample is None else max(state.last_sample, last)
        state.samples += int(all_times.size)

    def _feed_memory(self, pods: list[tuple[ContainerState, pd.DataFrame, pd.DataFrame | None]]) -> None:
        """Memory samples per pod in time order with its OOM kills among them (a kill after the samples of its
        second), the pods' events interleaved in time as VPA's feeder delivers them."""
        merged: list[tuple[float, int, int, int]] = []
        for index, (container, rows, ooms) in enumerate(pods):
            known = rows.loc[rows["memory"].notna(), ["timestamp", "memory"]]
            values = _amounts(known["memory"].to_numpy(dtype=np.float64)).tolist()
            events = [(t, 0, v) for t, v in zip(known["timestamp"].tolist(), values)]
            if ooms is not None:
                events += [
                    (float(t), 1, amount(float(r)) if r == r else 0)
                    for t, r in zip(ooms["timestamp"], ooms["request_bytes"])
                ]
                events.sort(key=lambda event: (event[0], event[1]))
            else:
                events = _peak_candidates(events, container)
            merged += [(t, kind, value, index) for t, kind, value in events]
        merged.sort(key=lambda event: event[0])
        for t, is_oom, value, index in merged:
            container = pods[index][0]
            if is_oom:
                if not container.record_oom(t, value, self.oom_min_bump_bytes, self.oom_bump_ratio):
                    self.skipped_["oom older than its window"] += 1
            elif not container.add_memory(value, t):
                self.skipped_["memory negative or older than the previous sample"] += 1

    def warm_start(self, group: str, status: dict[str, Any], now: float) -> None:
        """Load a VerticalPodAutoscalerCheckpoint status as `group`'s initial state (replacing an earlier one)."""
        check_is_fitted(self, "states_")
        state = self.new_state(now)
        state.load_checkpoint(status)
        self.initial_[group] = state

    def checkpoint(self, group: str, now: float) -> dict[str, Any]:
        """The checkpoint status VPA's writer would store for `group` at `now`: the merged state, without the peaks
        of memory windows still open (VPA leaves them out so a restart does not count a window twice)."""
        state = self.merged(group)
        if state is None:
            raise KeyError(f"nothing learned for {group}")
        for (owner, _), container in self.containers_.items():
            if owner == group and container.window_end is not None and now < container.window_end:
                state.memory.subtract_at(float(container.peak()), self.memory_peak_weight, container.window_end)
        return state.to_checkpoint(now)

    def merged(self, group: str, as_of: float | None = None) -> AggregateState | None:
        """A fresh aggregate with the live state and the warm start merged in (VPA's AggregateStateByContainerName);
        at `as_of` a live state past VPA's garbage collection (`AggregateState.is_expired`) is left out."""
        check_is_fitted(self, "states_")
        live, initial = self.states_.get(group), self.initial_.get(group)
        window = self.memory_aggregation_interval_seconds * self.memory_aggregation_interval_count
        if live is not None and as_of is not None and live.is_expired(as_of, window):
            live = None
        parts = [part for part in (live, initial) if part is not None]
        if not parts:
            return None
        merged = self.new_state(min(part.created for part in parts))
        for part in parts:
            merged.merge(copy.deepcopy(part))  # merging moves the older reference: the stored state must not move
        return merged

    def groups(self) -> list[str]:
        check_is_fitted(self, "states_")
        return sorted(set(self.states_) | set(self.initial_))

    def recommend(self, group: str, containers_per_pod: int, as_of: float) -> tuple[Bounds, Bounds] | None:
        """(CPU in millicores, memory in bytes) for `group` at `as_of`; None when VPA would have nothing: its live
        aggregate expired (garbage-collected) and no checkpoint was loaded for it."""
        state = self.merged(group, as_of)
        if state is None:
            return None
        fraction = 1.0 / max(containers_per_pod, 1)
        days = confidence(state, self.confidence_interval_seconds)
        cpu_min = scale_amount(cpu_millicores(self.pod_min_cpu_cores), fraction)
        memory_min = scale_amount(amount(self.pod_min_memory_bytes), fraction)
        cpu = self._bounds(lambda p: cpu_millicores(state.cpu.percentile(p)), days, cpu_min)
        memory = self._bounds(lambda p: amount(state.memory.percentile(p)), days, memory_min)
        return cpu, memory

    def _bounds(self, percentile: Any, days: float, minimum: int) -> Bounds:
        """VPA's estimator chain, truncating after each step: percentile, + margin, x confidence, >= minimum."""

        def margin(p: float) -> int:
            base: int = percentile(p)
            return base + scale_amount(base, self.safety_margin_fraction)

        lower = scale_amount(
            margin(self.lower_bound_percentile),
            confidence_factor(self.lower_bound_confidence_multiplier, self.lower_bound_confidence_exponent, days),
        )
        upper = scale_amount(
            margin(self.upper_bound_percentile),
            confidence_factor(self.upper_bound_confidence_multiplier, self.upper_bound_confidence_exponent, days),
        )
        return Bounds(
            target=max(margin(self.target_percentile), minimum),
            lower_bound=max(lower, minimum),
            upper_bound=max(upper, minimum),
        )


def _peak_candidates(events: list[tuple[float, int, int]], container: ContainerState) -> list[tuple[float, int, int]]:
    """Without OOM kills, only samples that open a window or exceed the window's running maximum change anything;
    the others are dropped before the sample-by-sample loop (they would only move the last sample time, which the
    final kept sample sets the same way). Negative or out-of-order samples are kept so they are counted."""
    if not events:
        return events
    kept: list[tuple[float, int, int]] = []
    window_end, running = container.window_end, container.peak()
    last = container.last_memory
    interval = container.interval_seconds
    for event in events:
        t, _, value = event
        if value < 0 or (last is not None and t < last):
            kept.append(event)
            continue
        last = t
        if window_end is None:
            window_end = t
        if t >= window_end:
            window_end += math.floor((t - window_end) / interval) * interval + interval
            running = value
            kept.append(event)
        elif running != 0 and value > running:
            running = value
            kept.append(event)
    # (Every sample may be dropped: a live update of one sample inside the window, under its running maximum.)
    if (not kept or kept[-1] is not events[-1]) and events[-1][2] >= 0:
        kept.append(events[-1])
    return kept
