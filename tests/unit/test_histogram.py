"""Hand-computed cases for VPA's decaying histogram: bucket edges, upper-edge percentiles, decay, epsilon, OOM."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import NotFittedError

from models.histogram import (
    MAX_DECAY_EXPONENT,
    DecayingHistogram,
    ExponentialBuckets,
    MemoryPeakHistogram,
    _merged_cells,
    vpa_reference_timestamps,
)

DAY = 86400.0
MIB = 1024.0**2


def frame(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["group", "timestamp", "value"])


def test_vpa_cpu_bucket_layout() -> None:
    buckets = ExponentialBuckets(first_bucket_size=0.01, max_value=1000.0, growth_ratio=0.05)
    # ceil(log_1.05(1000 * 0.05 / 0.01 + 1)) + 1 = ceil(174.56) + 1
    assert buckets.num_buckets == 176
    assert buckets.starts[0] == 0.0
    assert buckets.starts[1] == pytest.approx(0.01)
    assert buckets.starts[2] == pytest.approx(0.01 + 0.0105)
    assert buckets.starts[3] == pytest.approx(0.01 + 0.0105 + 0.011025)
    assert buckets.starts[-1] >= 1000.0 > buckets.starts[-2]
    found = buckets.find(np.array([0.0, 0.009, 0.015, 0.021, 1e9]))
    assert list(found) == [0, 0, 1, 2, 175]


def test_vpa_memory_bucket_layout() -> None:
    buckets = ExponentialBuckets(first_bucket_size=1e7, max_value=1e12, growth_ratio=0.05)
    assert buckets.num_buckets == 176
    assert buckets.starts[1] == pytest.approx(1e7)


@pytest.mark.parametrize("value", [0.003, 0.5, 1.0, 7.3, 123.0])
def test_percentile_is_the_upper_edge_of_the_bucket(value: float) -> None:
    hist = DecayingHistogram().fit(frame([("a", 0, value)]))
    buckets = hist.buckets
    bucket = int(buckets.find(np.array([value]))[0])
    for q in (0.0, 0.5, 1.0):
        assert hist.quantile(q)[0] == pytest.approx(buckets.starts[bucket + 1])
    # The conservative bias is at most one bucket: above ~1 core that is under 6 % of the value.
    assert value <= hist.quantile(0.9)[0]
    if value >= 1.0:
        assert hist.quantile(0.9)[0] <= value * 1.06


def test_percentile_walks_cumulative_weight() -> None:
    # Ten equal samples 0.1 .. 1.0: 45 % of the weight is reached at the fifth value, 85 % at the ninth.
    rows = [("a", 0, v / 10) for v in range(1, 11)]
    hist = DecayingHistogram(half_life_seconds=DAY).fit(frame(rows))
    starts, find = hist.buckets.starts, hist.buckets.find
    assert hist.quantile(0.45)[0] == pytest.approx(starts[find(np.array([0.5]))[0] + 1])
    assert hist.quantile(0.85)[0] == pytest.approx(starts[find(np.array([0.9]))[0] + 1])


def test_decay_doubles_the_weight_of_a_sample_one_half_life_newer() -> None:
    # Without decay the two samples weigh the same and p50 = the small one; one half-life later the big one
    # weighs 2/3 of the total, so p50 (threshold 1/2) falls in its bucket.
    same_time = DecayingHistogram(half_life_seconds=DAY).fit(frame([("a", 0, 1.0), ("a", 0, 10.0)]))
    later = DecayingHistogram(half_life_seconds=DAY).fit(frame([("a", 0, 1.0), ("a", DAY, 10.0)]))
    find, starts = later.buckets.find, later.buckets.starts
    assert same_time.quantile(0.5)[0] == pytest.approx(starts[find(np.array([1.0]))[0] + 1])
    assert later.quantile(0.5)[0] == pytest.approx(starts[find(np.array([10.0]))[0] + 1])
    weights = later.weights()[0][later.weights()[0] > 0]
    assert weights[1] / weights[0] == pytest.approx(2.0)
    assert weights[0] == pytest.approx(0.1)  # the CPU sample weight, at the reference


def test_reference_is_rebased_after_max_decay_exponent_half_lives() -> None:
    half_life = 3600.0
    late = (MAX_DECAY_EXPONENT + 5) * half_life
    hist = DecayingHistogram(half_life_seconds=half_life).fit(frame([("a", 0, 1.0), ("a", late, 2.0)]))
    assert hist.reference_timestamp_[0] == pytest.approx(late)
    # The old sample was scaled by 2^-105: far below epsilon, so it no longer counts as the first bucket.
    assert hist.quantile(0.0)[0] == pytest.approx(hist.buckets.starts[hist.buckets.find(np.array([2.0]))[0] + 1])


def test_empty_histogram_gives_zero_and_groups_are_independent() -> None:
    hist = DecayingHistogram().fit(frame([("a", 0, 1.0), ("b", 0, 5.0)]))
    a, b = hist.quantile(0.9)
    assert a < 1.1 and b > 5.0
    assert DecayingHistogram().fit(frame([])).quantile(0.5).size == 0


def test_missing_values_are_skipped_and_negative_values_refused() -> None:
    hist = DecayingHistogram().fit(frame([("a", 0, float("nan")), ("a", 1, 1.0)]))
    assert hist.sample_count_[0] == 1
    with pytest.raises(ValueError, match="non-negative"):
        DecayingHistogram().fit(frame([("a", 0, -1.0)]))


def test_quantile_before_fit_raises() -> None:
    with pytest.raises(NotFittedError):
        DecayingHistogram().quantile(0.5)


samples = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 40 * 86400), st.floats(0, 500, allow_nan=False)),
    min_size=1,
    max_size=60,
)


@given(samples, st.integers(0, 60))
@settings(max_examples=60, deadline=None)
def test_partial_fit_equals_one_fit(rows: list[tuple[str, int, float]], cut: int) -> None:
    rows = sorted(rows, key=lambda r: r[1])
    cut = min(cut, len(rows))
    whole = DecayingHistogram(half_life_seconds=12 * 3600).fit(frame(rows))
    parts = DecayingHistogram(half_life_seconds=12 * 3600).fit(frame(rows[:cut])).partial_fit(frame(rows[cut:]))
    order = [list(parts.groups_).index(g) for g in whole.groups_]
    for q in (0.5, 0.9, 0.95):
        np.testing.assert_allclose(parts.quantile(q)[order], whole.quantile(q), rtol=1e-9)


@given(samples)
@settings(max_examples=60, deadline=None)
def test_quantiles_are_monotone_and_bound_the_samples(rows: list[tuple[str, int, float]]) -> None:
    hist = DecayingHistogram(half_life_seconds=DAY).fit(frame(rows))
    q50, q90, q100 = hist.quantile(0.5), hist.quantile(0.9), hist.quantile(1.0)
    assert np.all(q50 <= q90) and np.all(q90 <= q100)
    maxima = frame(rows).groupby("group")["value"].max().reindex(hist.groups_).to_numpy()
    # p100 is the upper edge of the bucket holding the largest sample.
    np.testing.assert_allclose(q100, hist.buckets.starts[hist.buckets.find(maxima) + 1])


@given(samples, st.lists(st.floats(0, 1), min_size=1, max_size=4))
@settings(max_examples=60, deadline=None)
def test_quantiles_at_once_are_each_quantile(rows: list[tuple[str, int, float]], qs: list[float]) -> None:
    """A recommendation reads its three percentiles from one pass over the weights: the same values, bit for bit."""
    hist = DecayingHistogram(half_life_seconds=DAY).fit(frame(rows))
    for q, values in zip(qs, hist.quantiles(qs)):
        np.testing.assert_array_equal(values, hist.quantile(q))


@given(
    st.lists(st.integers(0, 500), max_size=40, unique=True),
    st.lists(st.tuples(st.integers(0, 500), st.floats(0, 9)), max_size=40, unique_by=lambda p: p[0]),
)
def test_cells_merged_by_search_are_the_sorted_union(kept: list[int], new: list[tuple[int, float]]) -> None:
    """A partial fit adds its samples' weights by a binary search and one insertion pass, not a sort of every cell:
    the cells and sums (a cell kept plus its new weight) are those of the sorted union."""
    cells = np.asarray(sorted(kept), dtype=np.int64)
    weights = np.linspace(1.0, 2.0, cells.size)
    new_cells = np.asarray(sorted(c for c, _ in new), dtype=np.int64)
    added = np.asarray([w for _, w in sorted(new)], dtype=np.float64)
    union, at = np.unique(np.concatenate([cells, new_cells]), return_inverse=True)
    summed = np.zeros(union.size)
    summed[at[: cells.size]] = weights
    summed[at[cells.size :]] += added
    got_cells, got_weights = _merged_cells(cells, weights.copy(), new_cells, added)
    np.testing.assert_array_equal(got_cells, union)
    np.testing.assert_array_equal(got_weights, summed)


def memory_frame(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([("w", pod, t, v) for pod, t, v in rows], columns=["group", "pod", "timestamp", "value"])


def test_memory_peaks_per_pod_per_day_anchored_at_first_sample() -> None:
    model = MemoryPeakHistogram().fit(
        memory_frame([("p1", 1000, 1e9), ("p1", 2000, 3e9), ("p1", 1000 + DAY, 2e9), ("p2", 5000, 4e9)])
    )
    peaks = model.peaks_.reset_index()
    assert list(zip(peaks["pod"], peaks["window_end"], peaks["value"])) == [
        ("p1", 1000 + DAY, 3e9),
        ("p1", 1000 + 2 * DAY, 2e9),
        ("p2", 5000 + DAY, 4e9),
    ]


def test_memory_keeps_only_the_newest_intervals() -> None:
    rows = [("p", d * DAY, (d + 1) * 1e9) for d in range(12)]
    model = MemoryPeakHistogram(interval_count=8).fit(memory_frame(rows))
    assert len(model.peaks_) == 8
    assert model.peaks_.min() == 5e9


@pytest.mark.parametrize(
    ("used", "recorded"),
    [(200 * MIB, 300 * MIB), (1024 * MIB, 1024 * MIB * 1.2)],  # max(+100 MiB, x1.2)
)
def test_oom_bumps_the_memory_sample(used: float, recorded: float) -> None:
    usage = memory_frame([("p", 0, 50 * MIB)])
    oom = memory_frame([("p", 600, used)])
    model = MemoryPeakHistogram().fit(usage, oom_events=oom)
    assert model.peaks_.iloc[0] == pytest.approx(recorded)
    bucket_top = model.histogram_.buckets.starts[model.histogram_.buckets.find(np.array([recorded]))[0] + 1]
    assert model.quantile(0.9)[0] == pytest.approx(bucket_top)


def test_memory_partial_fit_continues_the_open_window() -> None:
    first = memory_frame([("p", 0, 1e9)])
    later = memory_frame([("p", 3600, 2e9), ("p", DAY + 10, 1e9)])
    model = MemoryPeakHistogram().fit(first).partial_fit(later)
    whole = MemoryPeakHistogram().fit(pd.concat([first, later]))
    pd.testing.assert_series_equal(model.peaks_, whole.peaks_)
    assert math.isclose(model.quantile(0.9)[0], whole.quantile(0.9)[0])


def _replayed_references(rows: list[tuple[int, float]], half_life: float) -> dict[int, float]:
    """VPA's rule sample by sample in time order: a group's first sample sets its reference (rounded to the
    half-life, halves away from zero); a sample more than MAX_DECAY_EXPONENT half-lives past it moves it there."""
    reference: dict[int, float] = {}
    for group, t in sorted(rows, key=lambda row: (row[0], row[1])):
        if group not in reference or t > reference[group] + MAX_DECAY_EXPONENT * half_life:
            reference[group] = math.copysign(math.floor(abs(t) / half_life + 0.5), t) * half_life
    return reference


@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(0, 5e4, allow_nan=False)), min_size=1, max_size=60),
    st.sampled_from([1.0, 7.5, 60.0, 3600.0]),
)
@settings(max_examples=80, deadline=None)
def test_references_are_vpas_sample_by_sample_rule(rows: list[tuple[int, float]], half_life: float) -> None:
    """Short half-lives make the spans cross MAX_DECAY_EXPONENT half-lives, so the re-basing replay runs too."""
    codes = np.array([g for g, _ in rows], dtype=np.int64)
    times = np.array([t for _, t in rows])
    found = vpa_reference_timestamps(codes, times, np.full(5, np.nan), half_life)
    expected = _replayed_references(rows, half_life)
    for group in range(5):
        assert (found[group] == expected[group]) if group in expected else np.isnan(found[group])


def _peaks_by_hand(
    rows: list[tuple[str, str, float, float]], interval: float, count: int
) -> dict[tuple[str, str, float], float]:
    """VPA's memory peaks in plain Python: windows anchored at each pod's first sample, the peak dated at its
    window's end, the newest `count` windows of each group kept."""
    origin: dict[tuple[str, str], float] = {}
    for group, pod, t, _ in rows:
        origin[(group, pod)] = min(t, origin.get((group, pod), t))
    peaks: dict[tuple[str, str, float], float] = {}
    for group, pod, t, value in rows:
        start = origin[(group, pod)]
        end = start + (math.floor((t - start) / interval) + 1) * interval
        peaks[(group, pod, end)] = max(value, peaks.get((group, pod, end), value))
    newest: dict[str, float] = {}
    for group, _, end in peaks:
        newest[group] = max(end, newest.get(group, end))
    return {key: value for key, value in peaks.items() if key[2] > newest[key[0]] - count * interval}


memory_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["p1", "p2"]),
        st.integers(0, 12 * 3600).map(float),
        st.floats(0, 1e10, allow_nan=False),
    ),
    min_size=1,
    max_size=50,
)


@given(memory_rows, st.integers(1, 40), st.booleans())
@settings(max_examples=80, deadline=None)
def test_memory_peaks_and_histogram_follow_the_rule_whole_or_in_parts(
    rows: list[tuple[str, str, float, float]], cut: int, categorical: bool
) -> None:
    """Fitted whole or continued from any cut (in time order, as the samples arrive): the peaks are the rule's,
    sorted, and the histogram is a decaying histogram of exactly those peaks."""
    interval, count = 3600.0, 3
    rows = sorted(rows, key=lambda row: row[2])
    X = pd.DataFrame(rows, columns=["group", "pod", "timestamp", "value"])
    if categorical:
        X = X.assign(group=X["group"].astype("category"))
    model = MemoryPeakHistogram(interval_seconds=interval, interval_count=count).fit(X.iloc[:cut])
    if cut < len(X):
        model.partial_fit(X.iloc[cut:])
    expected = _peaks_by_hand(rows, interval, count)
    assert list(model.peaks_.index) == sorted(expected)
    assert model.peaks_.tolist() == [expected[key] for key in sorted(expected)]
    refit = DecayingHistogram(first_bucket_size=1e7, max_value=1e12, sample_weight=1.0).fit(
        model.peaks_.reset_index().rename(columns={"window_end": "timestamp"})
    )
    order = [list(refit.groups_).index(group) for group in model.histogram_.groups_]
    np.testing.assert_allclose(model.histogram_.weights(), refit.weights()[order], rtol=1e-12)
    np.testing.assert_array_equal(model.histogram_.reference_timestamp_, refit.reference_timestamp_[order])


def test_weights_keep_only_the_buckets_with_samples_and_dense_ones_pickled_before_load_as_them() -> None:
    """Issue 41: a group's weights cost its buckets that got a sample, not the layout's 176; a histogram pickled
    with the dense (groups x buckets) matrix loads into the same kept buckets and percentiles."""
    model = DecayingHistogram().fit(frame([("a", 0.0, 0.5), ("b", 0.0, 0.5), ("b", 60.0, 2.0), ("b", 120.0, 0.5)]))
    assert np.diff(model.weight_starts_).tolist() == [1, 2]
    state = model.__getstate__()
    old = {k: v for k, v in state.items() if not k.startswith("weight_")}
    loaded = DecayingHistogram.__new__(DecayingHistogram)
    loaded.__setstate__({**old, "weights_": model.weights()})
    np.testing.assert_array_equal(loaded.weights(), model.weights())
    np.testing.assert_array_equal(loaded.quantile(0.9), model.quantile(0.9))
