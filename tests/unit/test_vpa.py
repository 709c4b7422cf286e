"""The `vpa` policy against the VPA recommender's own unit-test expectations (v1.5.1, pkg/recommender), restated as
tables of inputs and expected outputs: histogram, decaying histogram, checkpoints, estimators, pod recommender,
aggregate container state and container state."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.histogram import ExponentialBuckets, LinearBuckets
from models.vpa import (
    AggregateState,
    ContainerState,
    DecayingHistogram,
    Histogram,
    VpaRecommender,
    amount,
    confidence,
    confidence_factor,
    cpu_millicores,
    go_round,
    scale_amount,
)

MIB = 1024 * 1024
HOUR, DAY = 3600.0, 86400.0
T0 = 1234567890.0
#: The tests' layout: ten 1-wide linear buckets and a tiny epsilon.
TEN = LinearBuckets(1.0, 10.0)
TINY = 1e-15
CPU = ExponentialBuckets(0.01, 1000.0, 0.05)
MEMORY = ExponentialBuckets(1e7, 1e12, 0.05)


def histogram(samples: list[tuple[float, float]], layout: Any = TEN, epsilon: float = TINY) -> Histogram:
    h = Histogram(layout, epsilon)
    for value, weight in samples:
        h.add(value, weight)
    return h


def decaying(samples: list[tuple[float, float, float]], half_life: float = HOUR) -> DecayingHistogram:
    h = DecayingHistogram(TEN, TINY, half_life_seconds=half_life)
    for value, weight, t in samples:
        h.add_at(value, weight, t)
    return h


def same(a: Histogram, b: Histogram) -> bool:
    """VPA's Equals: same range and per-bucket weights within 1e-15."""
    if (a.min_bucket, a.max_bucket) != (b.min_bucket, b.max_bucket):
        return False
    span = slice(a.min_bucket, a.max_bucket + 1)
    return bool(np.all(np.abs(a.weights[span] - b.weights[span]) <= 1e-15))


FOUR = [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (4.0, 4.0)]


@pytest.mark.parametrize(
    ("samples", "percentile", "expected"),
    [
        ([], -0.5, 0.0),
        ([], 0.0, 0.0),
        ([], 0.5, 0.0),
        ([], 1.0, 0.0),
        ([], 1.5, 0.0),
        (FOUR, 0.0, 2),
        (FOUR, 0.1, 2),
        (FOUR, 0.2, 3),
        (FOUR, 0.3, 3),
        (FOUR, 0.4, 4),
        (FOUR, 0.5, 4),
        (FOUR, 0.6, 4),
        (FOUR, 0.7, 5),
        (FOUR, 0.8, 5),
        (FOUR, 0.9, 5),
        (FOUR, 1.0, 5),
    ],
)
def test_histogram_percentiles(samples: list[tuple[float, float]], percentile: float, expected: float) -> None:
    assert histogram(samples).percentile(percentile) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("samples", "below", "above"),
    [
        ([(0.1, 0.1), (0.2, 0.2)], 0.2, 0.3),  # out-of-range percentiles stop at the first / last bucket
        ([(0.1, 0.1), (0.2, 0.2), (0.0, 0.1), (1.0, 0.2)], 0.1, 1.0),  # boundary buckets filled: the last has no end
    ],
)
def test_percentiles_outside_zero_one_clamp(samples: list[tuple[float, float]], below: float, above: float) -> None:
    h = histogram(samples, LinearBuckets(0.1, 1.0))
    assert h.percentile(-0.1) == pytest.approx(below, rel=1e-15)
    assert h.percentile(1.1) == pytest.approx(above, rel=1e-15)


@pytest.mark.parametrize(
    ("operations", "empty_after_each"),
    [
        ([("add", 0.1, 2.5), ("sub", 0.1, 1.0), ("sub", 0.1, 1.0)], [False, False, True]),
        ([("add", 9.9, 3.0), ("add", 0.1, 0.3), ("add", 999.9, 0.3)], [False, False, False]),
    ],
)
def test_emptiness_follows_epsilon(operations: list[tuple[str, float, float]], empty_after_each: list[bool]) -> None:
    h = histogram([], LinearBuckets(0.1, 1.0))
    assert h.is_empty()
    for (op, value, times_epsilon), empty in zip(operations, empty_after_each):
        (h.add if op == "add" else h.subtract)(value, times_epsilon * TINY)
        assert h.is_empty() is empty


def test_histogram_merge_adds_the_samples() -> None:
    merged = histogram([(1, 1), (2, 1)])
    merged.merge(histogram([(2, 1), (3, 1)]))
    assert same(merged, histogram([(1, 1), (2, 1), (2, 1), (3, 1)]))


def test_add_many_equals_adding_one_by_one() -> None:
    rng = np.random.default_rng(3)
    values, weights = rng.uniform(0, 12, 200), rng.uniform(0, 1e-14, 200)
    one_by_one = histogram(list(zip(values.tolist(), weights.tolist())))
    batched = Histogram(TEN, TINY)
    batched.add_many(values, weights)
    assert same(batched, one_by_one) and batched.total == one_by_one.total


@pytest.mark.parametrize(
    ("samples", "total", "buckets"),
    [
        ([], 0.0, {}),
        ([(1, 1)], 1.0, {"1": 10000}),
        ([(1, 1), (2, 100000)], 100001.0, {"2": 10000}),  # a bucket under half a unit of the largest is left out
        ([(1, 1), (2, 10000), (3, 50)], 10051.0, {"1": 1, "2": 10000, "3": 50}),
    ],
)
def test_save_checkpoint(samples: list[tuple[float, float]], total: float, buckets: dict[str, int]) -> None:
    assert histogram(samples).to_checkpoint() == {"totalWeight": total, "bucketWeights": buckets}


def test_load_checkpoint_scales_to_the_total() -> None:
    h = histogram([])
    h.load_checkpoint({"totalWeight": 6.0, "bucketWeights": {"0": 1, "1": 2}})
    assert (h.total, h.weights[0], h.weights[1]) == (6.0, 2.0, 4.0)


@pytest.mark.parametrize(
    ("checkpoint", "message"),
    [
        ({"totalWeight": 1.0, "bucketWeights": {"-1": 1}}, "outside"),
        ({"totalWeight": 1.0, "bucketWeights": {"99": 1}}, "outside"),
        ({"totalWeight": -1.0, "bucketWeights": {}}, "negative"),
        (None, "no checkpoint"),
    ],
)
def test_load_checkpoint_refuses_bad_input(checkpoint: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        histogram([]).load_checkpoint(checkpoint)


def test_checkpoint_of_boundary_weights_does_not_load_empty() -> None:
    h = histogram([(1, TINY), (2, 10000 * TINY - TINY)])
    loaded = histogram([])
    loaded.load_checkpoint(h.to_checkpoint())
    assert not h.is_empty() and not loaded.is_empty()


@pytest.mark.parametrize(
    ("samples", "percentile", "expected"),
    [
        ([], 0.5, 0.0),
        ([(2, 1000, T0), (1, 1, T0 + 20 * HOUR)], 0.999, 2),  # 20 half-lives later the old sample is almost gone
        ([(2, 1000, T0), (1, 1, T0 + 20 * HOUR)], 1.0, 3),  # ... but not quite
        ([(2, 1, T0), (1, 1, T0 + 101 * HOUR)], 1.0, 2),  # past 2^100 the reference moves, the old sample is gone
        *[
            ([(i, i, T0 + (i - 1) * HOUR) for i in range(1, 5)], p, e)
            for p, e in ((0.0, 2), (0.02, 2), (0.03, 3), (0.10, 3), (0.11, 4), (0.34, 4), (0.35, 5), (1.0, 5))
        ],
        *[([(i, i, T0) for i in range(1, 5)], p, e) for p, e in ((0.0, 2), (0.1, 2), (0.2, 3), (0.5, 4), (0.7, 5))],
    ],
)
def test_decaying_histogram_percentiles(
    samples: list[tuple[float, float, float]], percentile: float, expected: float
) -> None:
    assert decaying(samples).percentile(percentile) == pytest.approx(expected, rel=1e-15)


def test_decaying_merge_aligns_the_references() -> None:
    one = decaying([(1, 1, T0), (2, 1, T0 + HOUR)])
    one.merge_decaying(decaying([(2, 1, T0 + 2 * HOUR), (3, 1, T0 + HOUR)]))
    expected = decaying([(2, 1, T0 + 2 * HOUR), (2, 1, T0 + HOUR), (3, 1, T0 + HOUR), (1, 1, T0)])
    assert same(one, expected) and one.reference == expected.reference


def test_decaying_checkpoint_keeps_the_reference() -> None:
    h = decaying([(2, 1, T0 + 100 * HOUR)])
    saved = h.to_checkpoint()
    assert h.reference is not None and saved["referenceTimestamp"] == "2009-02-18T04:00:00Z"
    assert saved["bucketWeights"] and saved["totalWeight"] > 0
    loaded = decaying([])
    loaded.load_checkpoint(
        {"totalWeight": 6.0, "bucketWeights": {"0": 1}, "referenceTimestamp": "2018-01-02T03:04:05Z"}
    )
    assert not loaded.is_empty() and loaded.reference == 1514862245.0


@pytest.mark.parametrize(
    ("t", "unit", "expected"),
    [
        (T0, DAY, 1234569600.0),
        (T0, HOUR, 1234569600.0),
        (43200.0, DAY, 86400.0),
        (43199.0, DAY, 0.0),
        (T0, 7 * HOUR, 1234566000.0),
    ],  # Go rounds to multiples since its zero time (epoch-based: 1234573200), halves up
)
def test_reference_rounding_is_go_time_round(t: float, unit: float, expected: float) -> None:
    assert go_round(t, unit) == expected


# --- estimators (logic/estimator_test.go) ---


def state(samples: list[tuple[float, int]] | None = None) -> AggregateState:
    """An aggregate with CPU samples (time, millicores) fed through a container, as VPA's tests do."""
    aggregate = VpaRecommender().new_state(0.0)
    container = ContainerState(aggregate, DAY)
    for t, millicores in samples or []:
        container.add_cpu(millicores, t)
    return aggregate


NINE_EVERY_TWO_MINUTES = [(i * 120.0, 1000) for i in range(9)]


@pytest.mark.parametrize(
    ("samples", "interval", "multiplier", "exponent", "cpu_millicores_in", "memory_bytes_in", "cpu", "memory"),
    [
        ([], DAY, 1.0, 1.0, 3140, 3_140_000_000, 10**14, 10**14),  # no history: +Inf, capped at VPA's maximum
        ([], DAY, 1.0, -1.0, 3140, 3_140_000_000, 0, 0),  # ... or 0
        ([], DAY, 0.1, 2.0, 3140, 3_140_000_000, 10**14, 10**14),
        (NINE_EVERY_TWO_MINUTES, DAY, 0.1, 2.0, 3140, 3_140_000_000, 907_460, 907_460_000_000),
        (NINE_EVERY_TWO_MINUTES, 18 * 60.0, 0.1, 2.0, 3140, 3_140_000_000, 4521, 4_521_600_000),
    ],
)
def test_confidence_multiplier(
    samples: list[tuple[float, int]],
    interval: float,
    multiplier: float,
    exponent: float,
    cpu_millicores_in: int,
    memory_bytes_in: int,
    cpu: int,
    memory: int,
) -> None:
    days = confidence(state(samples), interval)
    factor = confidence_factor(multiplier, exponent, days)
    assert (scale_amount(cpu_millicores_in, factor), scale_amount(memory_bytes_in, factor)) == (cpu, memory)


@pytest.mark.parametrize(
    ("samples", "interval", "expected"),
    [(NINE_EVERY_TWO_MINUTES, DAY, 0.00625), (NINE_EVERY_TWO_MINUTES, 1080.0, 0.5), ([], DAY, 0.0)],
)
def test_confidence_counts_one_sample_a_minute(
    samples: list[tuple[float, int]], interval: float, expected: float
) -> None:
    assert confidence(state(samples), interval) == expected


@pytest.mark.parametrize(
    ("history_seconds", "lower_factor", "upper_factor"),
    [
        (0, 0.0, math.inf),
        (300, 0.603, 289.0),
        (1800, 0.910, 49.0),
        (3600, 0.954, 25.0),
        (DAY, 0.998, 2.0),
        (7 * DAY, 0.9997, 8 / 7),
    ],
)
def test_bound_factors_from_history(history_seconds: float, lower_factor: float, upper_factor: float) -> None:
    """VPA's documented factors: none -> x0 / x+Inf, 5 min -> x0.6, 30 min -> x0.9, 1 h -> x0.95, 24 h -> x2."""
    samples = [(t, 100) for t in np.arange(0, history_seconds + 1, 60.0)]
    days = confidence(state(samples), DAY)
    assert confidence_factor(0.001, -2.0, days) == pytest.approx(lower_factor, abs=1e-3)
    assert confidence_factor(1.0, 1.0, days) == pytest.approx(upper_factor, rel=1e-9)


@pytest.mark.parametrize(
    ("cores", "fraction", "expected"),
    [(3.14, 0.1, 3454), (3.14, 0.15, 3611), (0.0125, 0.0, 12), (1.0, 0.15, 1150)],  # whole millicores after each step
)
def test_margin_truncates_after_each_step(cores: float, fraction: float, expected: int) -> None:
    base = cpu_millicores(cores)
    assert base + scale_amount(base, fraction) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(-1.0, 0), (12.9, 12), (1e15, 10**14), (math.inf, 10**14), (math.nan, -(2**63))]
)
def test_resource_amount_conversion(value: float, expected: int) -> None:
    assert amount(value) == expected


def test_percentile_estimator_reads_the_histograms() -> None:
    cpu, memory = (
        histogram([(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)], CPU, 1e-4),
        histogram([(1e9, 1), (2e9, 1), (3e9, 1)], MEMORY, 1e-4),
    )
    assert cpu_millicores(cpu.percentile(0.2)) / 1000 == pytest.approx(1.0, rel=0.05)
    assert amount(memory.percentile(0.5)) == pytest.approx(2e9, rel=0.05)


# --- pod recommender (logic/recommender_test.go) ---


@pytest.mark.parametrize(
    ("containers", "cpu", "memory", "cpu_minimum"),
    [(1, 25, 262_144_000, 25), (2, 12, 131_072_000, 12), (3, 11, 87_381_333, 8)],  # 12.5m -> 12m; 11m beats 8m
)
def test_pod_minimum_is_split_across_containers(containers: int, cpu: int, memory: int, cpu_minimum: int) -> None:
    model = VpaRecommender().fit(usage([(0.0, 0.001, 1e6)]))  # p90 of 1m: the first bucket's end, 10m, + 15 %: 11m
    found = model.recommend("g", containers, 60.0)
    assert found is not None
    assert (found[0].target, found[1].target) == (cpu, memory)
    assert (found[0].lower_bound, found[1].lower_bound) == (cpu_minimum, memory)  # no history: x0, then the minimum


def test_upper_bound_of_a_single_sample_is_vpas_maximum() -> None:
    found = VpaRecommender().fit(usage([(0.0, 2.0, 2e9)])).recommend("g", 1, 60.0)
    assert found is not None
    assert found[0].upper_bound == 10**14 and found[1].upper_bound == 10**14  # history 0: x +Inf
    assert found[0].lower_bound == 25 and found[1].lower_bound == 262_144_000  # x 0, then the pod minimum


def usage(rows: list[tuple[float, float, float]], pod: str = "p", group: str = "g") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "group": group,
            "pod": pod,
            "timestamp": [r[0] for r in rows],
            "cpu_cores": [r[1] for r in rows],
            "memory_bytes": [r[2] for r in rows],
        }
    )


# --- aggregate container state (model/aggregate_container_state_test.go) ---


def test_aggregates_of_a_container_name_merge() -> None:
    pods = pd.concat([usage([(T0, 1.0, 2e9)], pod="pod-1"), usage([(T0, 3.0, 4e9)], pod="pod-2")])
    model = VpaRecommender().fit(pods)
    merged = model.merged("g")
    assert merged is not None and merged.samples == 2
    expected_memory = VpaRecommender().new_state(0).memory
    for pod in ("pod-1", "pod-2"):
        container = model.containers_[("g", pod)]
        expected_memory.add_at(float(container.peak()), 1.0, float(container.window_end))  # type: ignore[arg-type]
    assert same(merged.memory, expected_memory)


def test_aggregate_checkpoint_round_trip() -> None:
    t1, t2 = 1514772184.0, 1517450584.0  # 2018-01-01T02:03:04Z, 2018-02-01T02:03:04Z
    aggregate = VpaRecommender().new_state(0)
    aggregate.first_sample, aggregate.last_sample, aggregate.samples = t1, t2, 10
    aggregate.cpu.add_at(1, 33, t2)
    aggregate.memory.add_at(1, 55, t1)
    aggregate.memory.add_at(10000000, 55, t1)
    saved = aggregate.to_checkpoint(t2 + 5)
    assert (saved["firstSampleStart"], saved["lastSampleStart"]) == ("2018-01-01T02:03:04Z", "2018-02-01T02:03:04Z")
    assert (saved["totalSamplesCount"], saved["version"]) == (10, "v3")
    assert len(saved["cpuHistogram"]["bucketWeights"]) == 1 and len(saved["memoryHistogram"]["bucketWeights"]) == 2
    loaded = VpaRecommender().new_state(0)
    loaded.load_checkpoint(saved)
    assert (loaded.first_sample, loaded.last_sample, loaded.samples) == (t1, t2, 10)
    assert not loaded.cpu.is_empty() and not loaded.memory.is_empty()
    with pytest.raises(ValueError, match="unsupported checkpoint version 'foo'"):
        VpaRecommender().new_state(0).load_checkpoint({"version": "foo"})


@pytest.mark.parametrize(
    ("samples", "after_days", "expired"),
    [(1, 7, False), (1, 8, True), (0, 7, False), (0, 8, True)],  # by the last sample, or the creation when empty
)
def test_aggregate_expiry(samples: int, after_days: float, expired: bool) -> None:
    aggregate = VpaRecommender().new_state(T0)
    aggregate.last_sample, aggregate.samples = (T0, samples) if samples else (None, 0)
    assert aggregate.is_expired(T0 + after_days * DAY, 8 * DAY) is expired


# --- container state (model/container_test.go) ---


@dataclass
class Recorder:
    """Stands in for a histogram and records what the container state does to it."""

    calls: list[tuple[str, float, float, float]] = field(default_factory=list)

    def add_at(self, value: float, weight: float, t: float) -> None:
        self.calls.append(("add", value, weight, t))

    def subtract_at(self, value: float, weight: float, t: float) -> None:
        self.calls.append(("subtract", value, weight, t))


def recording() -> tuple[ContainerState, Recorder, Recorder]:
    cpu, memory = Recorder(), Recorder()
    aggregate = AggregateState(cpu=cpu, memory=memory, created=0.0)  # type: ignore[arg-type]
    return ContainerState(aggregate, DAY), cpu, memory


def test_container_samples_go_to_the_histograms_and_bad_ones_are_refused() -> None:
    c, cpu, memory = recording()
    step = DAY / 2
    accepted = [
        c.add_cpu(3140, T0),
        c.add_memory(5, T0),
        c.add_cpu(6280, T0 + step),
        c.add_memory(10, T0 + step),
        c.add_cpu(1570, T0 + 2 * step),
        c.add_memory(2, T0 + 2 * step),
    ]
    refused = [c.add_cpu(1000, T0 + 2 * step), c.add_cpu(-1000, T0 + 4 * step), c.add_memory(-1000, T0 + 4 * step)]
    assert accepted == [True] * 6 and refused == [False] * 3
    assert cpu.calls == [("add", 3.14, 0.1, T0), ("add", 6.28, 0.1, T0 + step), ("add", 1.57, 0.1, T0 + 2 * step)]
    end = T0 + DAY
    assert memory.calls == [("add", 5, 1, end), ("subtract", 5, 1, end), ("add", 10, 1, end), ("add", 2, 1, end + DAY)]


def test_memory_sample_at_the_same_time_is_taken_an_older_one_refused() -> None:
    c, _, memory = recording()
    assert c.add_memory(5, T0) and c.add_memory(7, T0) and not c.add_memory(9, T0 - 1)
    assert memory.calls[-1] == ("add", 7, 1, T0 + DAY)


@pytest.mark.parametrize(
    ("before", "ooms", "results", "calls"),
    [
        ([], [(T0, 1000 * MIB)], [True], [("add", 1200 * MIB, 1, T0 + DAY)]),  # x1.2
        ([], [(T0, 1 * MIB)], [True], [("add", 101 * MIB, 1, T0 + DAY)]),  # at least +100 MiB
        (  # smaller OOMs do not push the value further; a larger one does
            [],
            [(T0, 1000 * MIB), (T0, 999 * MIB), (T0, 999 * MIB), (T0, 2000 * MIB)],
            [True] * 4,
            [("add", 1200 * MIB, 1, T0 + DAY), ("subtract", 1200 * MIB, 1, T0 + DAY), ("add", 2400 * MIB, 1, T0 + DAY)],
        ),
        (  # the window's usage peak above the request is what gets bumped
            [(T0, 3000 * MIB)],
            [(T0, 1000 * MIB)],
            [True],
            [("add", 3000 * MIB, 1, T0 + DAY), ("subtract", 3000 * MIB, 1, T0 + DAY), ("add", 3600 * MIB, 1, T0 + DAY)],
        ),
        ([(T0, 1000 * MIB)], [(T0 - 30 * HOUR, 1000 * MIB)], [False], [("add", 1000 * MIB, 1, T0 + DAY)]),  # too old
        (  # in a later window: bumped from the last peak seen, dated at the new window's end
            [(T0, 2000 * MIB)],
            [(T0 + 2 * DAY, 1000 * MIB)],
            [True],
            [("add", 2000 * MIB, 1, T0 + DAY), ("add", 2400 * MIB, 1, T0 + 3 * DAY)],
        ),
    ],
)
def test_oom_kills(
    before: list[tuple[float, int]],
    ooms: list[tuple[float, int]],
    results: list[bool],
    calls: list[tuple[str, float, float, float]],
) -> None:
    c, _, memory = recording()
    for t, value in before:
        assert c.add_memory(value, t)
    assert [c.record_oom(t, request, 100 * MIB, 1.2) for t, request in ooms] == results
    assert memory.calls == calls


# --- the estimator on frames ---


def test_refused_samples_are_skipped_one_by_one_and_counted() -> None:
    model = VpaRecommender().fit(
        usage([(0.0, 1.0, 1e9), (0.0, 2.0, 2e9), (60.0, math.nan, 3e9), (120.0, 0.5, math.nan)])
    )
    assert model.skipped_["cpu not after the previous sample"] == 1  # the second CPU sample at t=0
    assert model.merged("g").samples == 2  # type: ignore[union-attr]
    later = model.partial_fit(usage([(30.0, 1.0, 1e9)]))  # older than what the pod already gave
    assert later.skipped_["cpu not after the previous sample"] == 2
    assert later.skipped_["memory negative or older than the previous sample"] == 1


def test_incremental_fit_equals_one_fit() -> None:
    rng = np.random.default_rng(0)
    times = np.arange(0, 3 * DAY, 300.0)
    rows = list(zip(times.tolist(), rng.uniform(0, 2, times.size).tolist(), rng.uniform(1e8, 3e9, times.size).tolist()))
    whole = VpaRecommender().fit(usage(rows))
    parts = VpaRecommender().fit(usage(rows[:400])).partial_fit(usage(rows[400:]))
    assert whole.recommend("g", 1, 3 * DAY) == parts.recommend("g", 1, 3 * DAY)


def test_oom_events_bump_from_the_request() -> None:
    rows = [(t, 0.1, 5e8) for t in np.arange(0, DAY, 600.0).tolist()]
    ooms = pd.DataFrame({"group": ["g"], "pod": ["p"], "timestamp": [DAY / 2], "request_bytes": [1e9]})
    with_oom = VpaRecommender().fit(usage(rows), oom_events=ooms)
    found = with_oom.recommend("g", 1, DAY)
    assert found is not None and found[1].target >= 1.2e9  # max(1e9 + 100 MiB, 1e9 x 1.2), + margin
    old = ooms.assign(timestamp=-2 * DAY)
    assert (
        VpaRecommender().fit(usage(rows), oom_events=old).skipped_["oom older than its window"] == 0
    )  # before any sample: taken


# --- checkpoints: round trip within the integer scaling's precision ---


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 50), st.floats(1e-3, 1e3)), min_size=1, max_size=40))
def test_checkpoint_round_trip_is_within_the_scaling(samples: list[tuple[float, float]]) -> None:
    original = histogram(samples, LinearBuckets(1.0, 60.0), 1e-4)
    loaded = histogram([], LinearBuckets(1.0, 60.0), 1e-4)
    loaded.load_checkpoint(original.to_checkpoint())
    largest = float(original.weights.max())
    buckets = int(np.count_nonzero(original.weights))
    assert loaded.total == pytest.approx(original.total)
    assert np.all(np.abs(loaded.weights - original.weights) <= 0.5 * (buckets + 1) * largest / 10000 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 4_000_000_000), st.integers(1, 10**6))
def test_aggregate_checkpoint_times_and_counts_round_trip(first: int, count: int) -> None:
    aggregate = VpaRecommender().new_state(0)
    aggregate.first_sample, aggregate.last_sample, aggregate.samples = float(first), float(first + 60), count
    aggregate.cpu.add_at(1.0, 0.1, float(first))
    loaded = VpaRecommender().new_state(0)
    loaded.load_checkpoint(aggregate.to_checkpoint(float(first + 120)))
    assert (loaded.first_sample, loaded.last_sample, loaded.samples) == (first, first + 60, count)
    assert loaded.cpu.reference == aggregate.cpu.reference


def test_warm_start_from_a_checkpoint_recommends_as_the_samples_did() -> None:
    rng = np.random.default_rng(1)
    times = np.arange(0, 4 * DAY, 60.0)
    rows = list(
        zip(
            times.tolist(),
            np.round(rng.uniform(0.1, 1.5, times.size), 3).tolist(),
            rng.uniform(2e8, 9e8, times.size).tolist(),
        )
    )
    direct = VpaRecommender().fit(usage(rows))
    now = 6 * DAY  # every memory window has closed: the checkpoint holds all the peaks
    warm = VpaRecommender().fit(usage([]))
    warm.warm_start("g", direct.checkpoint("g", now), now)
    assert warm.recommend("g", 1, now) == direct.recommend("g", 1, now)


def test_malformed_checkpoint_times_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="not RFC 3339"):
        VpaRecommender().new_state(0).load_checkpoint({"version": "v3", "firstSampleStart": "yesterday"})


# --- the policy in the workload model, the JSON and the status writer ---


def tidy(workloads: dict[str, float], days: float = 2.0) -> pd.DataFrame:
    """Minute samples of one pod per workload in namespaces `legacy` and `shop` (CPU flat at the given cores)."""
    frames = []
    times = np.arange(START, START + days * DAY, 60.0)
    for name, cores in workloads.items():
        namespace, workload = name.split("/")
        frames.append(
            pd.DataFrame(
                {
                    "timestamp": times,
                    "namespace": namespace,
                    "workload": workload,
                    "pod": f"{workload}-1",
                    "container": "app",
                    "cpu_cores": cores,
                    "memory_bytes": 5e8,
                    "cpu_request_cores": 1.0,
                    "cpu_limit_cores": 2.0,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


START = 1_700_006_400.0


@pytest.mark.parametrize(
    ("rules", "default", "expected"),
    [
        ([], "forecast", {"legacy/a": "forecast", "shop/b": "forecast"}),
        ([], "vpa", {"legacy/a": "vpa", "shop/b": "vpa"}),
        ([{"namespace": "leg*", "policy": "vpa"}], "forecast", {"legacy/a": "vpa", "shop/b": "forecast"}),
        (
            [{"namespace": "shop", "workload": "b", "policy": "forecast"}, {"policy": "vpa"}],
            "forecast",
            {"legacy/a": "vpa", "shop/b": "forecast"},
        ),
    ],
)
def test_the_policy_is_chosen_per_namespace_and_workload(
    rules: list[dict[str, str]], default: str, expected: dict[str, str]
) -> None:
    from models.settings import ModelSettings
    from models.workload import WorkloadRecommender
    from recommender.settings import ForecastSettings, PolicySettings

    policy = PolicySettings.model_validate({"request_policy": default, "request_policy_rules": rules})
    result = (
        WorkloadRecommender.from_settings(ModelSettings(policy=policy, forecast=ForecastSettings(enabled=False)))
        .fit(tidy({"legacy/a": 0.0125, "shop/b": 0.3}))
        .predict()
    )
    got = {f"{r.namespace}/{r.workload}": r.cpu.policy for r in result.recommendations if r.cpu is not None}
    assert got == expected
    for rec in result.recommendations:
        assert rec.cpu is not None and rec.memory is not None
        if rec.cpu.policy == "vpa":
            assert rec.cpu.models is not None and rec.cpu.models.target == "VPA recommender v1.5.1"
            assert rec.cpu.target * 1000 == int(rec.cpu.target * 1000 + 1e-9)  # whole millicores
            assert rec.cpu.limit == pytest.approx(2.0 * rec.cpu.target / 1.0)
            # The limit floor still holds: a VPA-sized request never brings the limit under the observed peak.
            assert rec.memory.limit_floor is not None
            assert rec.memory.limit is None or rec.memory.limit >= rec.memory.limit_floor


def test_status_writer_writes_vpa_values_as_vpa_does() -> None:
    from recommender.cluster_status import vpa_status
    from recommender.resources import CurrentResources, History, Peak, ResourceRecommendation, WorkloadRecommendation

    def resource(value: float, policy: str) -> ResourceRecommendation:
        return ResourceRecommendation(
            target=value,
            lower_bound=value,
            upper_bound=value,
            uncapped_target=value,
            short_term=[value],
            long_term=value,
            peak=Peak(value=value, at=0),
            policy=policy,  # type: ignore[arg-type]
        )

    def status(policy: str) -> dict[str, Any]:
        rec = WorkloadRecommendation(
            namespace="legacy",
            workload="a",
            container="app",
            cpu=resource(0.0125, policy),
            memory=resource(131072000.5, policy),
            current=CurrentResources(),
            history=History(first_sample=0, last_sample=2 * 86400, pods=1, samples=10),
        )
        vpa = {"spec": {"targetRef": {"kind": "Deployment", "name": "a"}}}
        found: dict[str, Any] = vpa_status([rec], vpa, "v1")["recommendation"]["containerRecommendations"][0]["target"]
        return found

    assert status("vpa") == {"cpu": "12m", "memory": "125Mi"}  # truncated, exact bytes: VPA's ResourceAmount
    assert status("forecast") == {"cpu": "13m", "memory": "126Mi"}  # ours round up


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from([0, 1, 2, 3, 5, 8, 13, 40]), st.booleans()), max_size=60))
def test_dropping_samples_below_the_window_peak_changes_nothing(draws: list[tuple[int, int, bool]]) -> None:
    """The estimator feeds only samples that open a window or beat its peak (`_peak_candidates`): the same state as
    every sample one by one, zeros and repeated times included."""
    from models.vpa import _peak_candidates

    events, t = [], 0.0
    for step_hours, value, same_time in draws:
        t += 0 if same_time else step_hours * HOUR
        events.append((t, 0, value * 10**7))
    full, _, full_memory = recording()
    for moment, _, value in events:
        full.add_memory(value, moment)
    fast, _, fast_memory = recording()
    for moment, _, value in _peak_candidates(events, fast):
        fast.add_memory(value, moment)
    assert fast_memory.calls == full_memory.calls
    assert (fast.window_end, fast.memory_peak, fast.last_memory) == (
        full.window_end,
        full.memory_peak,
        full.last_memory,
    )
