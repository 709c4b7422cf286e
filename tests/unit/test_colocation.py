"""Reclaimable node resources: every formula of `recommender.colocation` on hand-computed nodes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recommender import colocation as c

NAN = float("nan")
finite = st.floats(0, 1e6, allow_nan=False)


def test_batch_leaves_the_forecast_and_the_margin_to_high_priority_pods() -> None:
    # room = 10 - 1 - max(0.5, 1) = 8; expected HP usage = max(3, 2 + 0.5) = 3
    assert c.reclaimable(10.0, 1.0, 0.5, 1.0, 3.0, 2.0, 6.0, jump=0.5) == pytest.approx(5.0)
    # the last measurement plus its possible rise is above the forecast: max(3, 4 + 0.5) = 4.5
    assert c.reclaimable(10.0, 1.0, 0.5, 1.0, 3.0, 4.0, 6.0, jump=0.5) == pytest.approx(3.5)
    # a reservation above the room offers nothing, never a negative amount
    assert c.reclaimable(10.0, 1.0, 0.5, 1.0, 9.0, 2.0, 6.0) == 0.0


def test_without_a_measurement_the_forecast_keeps_the_wider_margin() -> None:
    # measured: 10 - 1 - max(3, 2 + 0.5) = 6; unmeasured (NaN): 10 - 2.5 - 3 = 4.5
    assert c.reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, 2.0, 6.0, jump=0.5, unmeasured_margin=2.5) == pytest.approx(6.0)
    assert c.reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, NAN, 6.0, jump=0.5, unmeasured_margin=2.5) == pytest.approx(4.5)
    # per node-step: only the unmeasured steps take it
    mixed = c.reclaimable(10.0, 1.0, 0.0, 0.0, np.array([3.0, 3.0]), np.array([2.0, NAN]), 6.0, unmeasured_margin=2.5)
    np.testing.assert_allclose(mixed, [6.0, 4.5])
    # the conservative side keeps it too: (9 - 3) and (10 - 2.5 - 6) blended half and half, unmeasured
    assert c.reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, NAN, 6.0, weight=0.5, unmeasured_margin=2.5) == pytest.approx(
        0.5 * 4.5 + 0.5 * 1.5
    )


def test_stale_data_decays_toward_the_request_based_value_not_to_zero() -> None:
    fresh = c.reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, 2.0, 6.0, weight=1.0)  # 9 - 3 = 6
    half = c.reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, 2.0, 6.0, weight=0.5)  # (6 + (9 - 6)) / 2
    none = c.reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, 2.0, 6.0, weight=0.0)  # 9 - 6
    assert (fresh, half, none) == (pytest.approx(6.0), pytest.approx(4.5), pytest.approx(3.0))
    assert c.staleness_weight(600.0, 900, 3600) == 1.0
    assert c.staleness_weight(900.0 + 3600, 900, 3600) == pytest.approx(0.5)
    assert c.staleness_weight(900.0 + 7200, 900, 3600) == pytest.approx(0.25)


def test_usage_above_requests_is_never_offered_by_the_conservative_side() -> None:
    # HP pods use 8 while requesting 2: the conservative value (9 - 2) must not win over the forecast one (9 - 8)
    assert c.reclaimable(10.0, 1.0, 0.0, 0.0, 8.0, 8.0, 2.0, weight=0.0) == pytest.approx(1.0)


def test_a_node_without_history_counts_its_requests() -> None:
    assert c.reclaimable(10.0, 1.0, 0.0, 0.0, NAN, NAN, 6.0) == pytest.approx(3.0)
    assert c.reclaimable(10.0, 1.0, 0.0, 0.0, NAN, NAN, NAN) == pytest.approx(9.0)


def test_koordinator_batch_policies() -> None:
    usage = np.array([1.0, NAN, 2.0])  # the second pod has no metrics: Koordinator counts its request
    request = np.array([2.0, 1.5, 0.5])
    used = {p: float(c.koordinator_hp_used(p, usage, request)) for p in c.KOORDINATOR_POLICIES}
    assert used == {"usage": 4.5, "request": 4.0, "maxUsageRequest": 5.5}
    # capacity 10 x 60 % - max(system 0.5, reserved 1) - HPUsed, floored at 0
    batch = {p: float(c.koordinator_batch(10.0, 60.0, 0.5, 1.0, v)) for p, v in used.items()}
    assert batch == {"usage": pytest.approx(0.5), "request": pytest.approx(1.0), "maxUsageRequest": 0.0}
    assert c.koordinator_batch(10.0, 60.0, 0.5, 1.0, 1.0, metrics_age_seconds=900) == pytest.approx(4.0)
    assert c.koordinator_batch(10.0, 60.0, 0.5, 1.0, 1.0, metrics_age_seconds=901) == 0.0
    with pytest.raises(ValueError, match="unknown"):
        c.koordinator_hp_used("guess", usage, request)  # type: ignore[arg-type]


def test_koordinator_cpu_has_no_request_policy() -> None:
    assert c.KOORDINATOR_RESOURCE_POLICIES["cpu"] == ("usage", "maxUsageRequest")
    assert set(c.KOORDINATOR_RESOURCE_POLICIES["memory"]) == set(c.KOORDINATOR_POLICIES)


DAY = 86400.0


def mid(
    capacity: float,
    request: list[float],
    peak: list[float],
    age: list[float],
    pooled: float,
    usage: float,
    **kwargs: float,
) -> float:
    return float(c.koordinator_mid(capacity, np.array(request), np.array(peak), np.array(age), pooled, usage, **kwargs))


def test_koordinator_mid_per_pod_predictor() -> None:
    # peaks x 1.1: 1.1, 2.2; reclaimable (4 - 1.1) + (3 - 2.2) = 3.7; the pooled and node caps are wide open
    assert mid(100.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, 2 * DAY], 0.0, 0.0) == pytest.approx(3.7)
    # capacity minus the unreclaimable peaks caps it: 4 - 3.3 = 0.7
    assert mid(4.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, 2 * DAY], 0.0, 0.0) == pytest.approx(0.7)
    # a pod using more than its request adds its peak to the unreclaimable, nothing to the reclaimable
    assert mid(100.0, [4.0, 1.0], [1.0, 5.0], [2 * DAY, 2 * DAY], 0.0, 0.0) == pytest.approx(2.9)
    # a pod in its first day (cold start) adds to neither side of the per-pod predictor
    assert mid(100.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, DAY], 0.0, 0.0) == pytest.approx(2.9)
    # an absent pod (NaN request) counts for nothing anywhere
    assert mid(100.0, [4.0, NAN], [1.0, 9.0], [2 * DAY, 2 * DAY], 0.0, 0.0) == pytest.approx(2.9)


def test_koordinator_mid_is_the_smaller_of_per_pod_and_pooled_then_capped_by_node_usage() -> None:
    # per pod 3.7; pooled: requests 7 - 1.1 x 5 = 1.5 (the pods' peaks rarely coincide, so the pooled peak is lower
    # than their sum, but here it is higher); capacity - usage = 100 - 10
    assert mid(100.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, 2 * DAY], 5.0, 10.0) == pytest.approx(1.5)
    # the pooled predictor counts a young pod's request too: (4 + 3) - 1.1 = 5.9 > per pod 2.9
    assert mid(100.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, DAY], 1.0, 0.0) == pytest.approx(2.9)
    # the node's measured usage leaves only 2 unused
    assert mid(10.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, 2 * DAY], 0.0, 8.0) == pytest.approx(2.0)
    assert mid(10.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, 2 * DAY], 0.0, 12.0) == 0.0
    # its threshold caps it at a share of capacity; its safety margin scales every peak
    assert mid(10.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, 2 * DAY], 0.0, 0.0, threshold_percent=20.0) == pytest.approx(2.0)
    assert mid(100.0, [4.0, 3.0], [1.0, 2.0], [2 * DAY, 2 * DAY], 0.0, 0.0, safety_margin_percent=50) == pytest.approx(
        (4 - 1.5) + (3 - 3.0)
    )
    # stale node metrics (older than 15 minutes) reset it
    assert mid(100.0, [4.0], [1.0], [2 * DAY], 0.0, 0.0, metrics_age_seconds=900) == pytest.approx(2.9)
    assert mid(100.0, [4.0], [1.0], [2 * DAY], 0.0, 0.0, metrics_age_seconds=901) == 0.0
    # the unallocated share (default 0): capacity 10 - requests 4 = 6, 50 % of it added
    assert mid(10.0, [4.0], [1.0], [2 * DAY], 0.0, 0.0, unallocated_percent=50) == pytest.approx(2.9 + 3.0)


def test_koordinator_mid_over_nodes_and_steps() -> None:
    # 2 nodes x 2 pod slots x 3 steps, reduced along the pod axis: one value per node and step
    request = np.array([[[4.0] * 3, [3.0] * 3], [[2.0] * 3, [NAN] * 3]])
    peak = np.full(request.shape, 1.0)
    age = np.full(request.shape, 2 * DAY)
    found = c.koordinator_mid(
        np.array([[100.0], [100.0]]), request, peak, age, np.zeros((2, 3)), np.zeros((2, 3)), axis=1
    )
    np.testing.assert_allclose(found, [[4.8] * 3, [0.9] * 3])


@given(
    st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100), st.floats(0, 5 * DAY)), min_size=1, max_size=8),
    st.floats(0, 1000),
    st.floats(0, 500),
    st.floats(0, 500),
)
def test_koordinator_mid_is_bounded(
    pods: list[tuple[float, float, float]], capacity: float, pooled: float, usage: float
) -> None:
    request, peak, age = (np.array(column) for column in zip(*pods))
    value = float(c.koordinator_mid(capacity, request, peak, age, pooled, usage))
    assert 0.0 <= value <= max(capacity - usage, 0.0) + 1e-9
    assert value <= request.sum() + 1e-9


def test_reclaim_percent_gives_koordinator_our_headroom_over_its_live_usage() -> None:
    # capacity 10, margin 1, forecast rise 1.5 over the window, rise allowance 0.5: headroom 2.5
    percent = float(c.reclaim_percent(10.0, 1.0, 1.5, 0.5))
    assert percent == 75.0
    # Koordinator with that percent, reserved 1 (allocatable 9) and live usage 3: 9 - 1 - (3 + 1.5)
    assert c.koordinator_batch(10.0, percent, 0.0, 1.0, 3.0) == pytest.approx(3.5)
    assert float(c.reclaim_percent(10.0, 1.0, -2.0, 0.5)) == 85.0  # a falling forecast: the allowance
    # rounded down to a whole percent, never up: 1 - 1.234 / 10 = 0.8766 -> 87
    assert float(c.reclaim_percent(10.0, 1.0, 0.234, 0.0)) == 87.0
    assert float(c.reclaim_percent(10.0, 30.0, 0.0, 0.0)) == 0.0
    assert float(c.reclaim_percent(0.0, 1.0, 0.0, 0.0)) == 0.0


def test_koordinator_reads_the_label_by_truncation() -> None:
    assert c.koordinator_reclaim_percent("0.29") == 28  # 0.29 x 100 = 28.999... in binary
    assert c.koordinator_reclaim_percent("0.7") == 70 and c.koordinator_reclaim_percent("1.5") == 150
    for bad in ("", "lots", "-0.1", "nan", "inf"):
        assert c.koordinator_reclaim_percent(bad) is None
    assert c.reclaim_ratio_label(29) == "0.291" and c.reclaim_ratio_label(60) == "0.60"
    with pytest.raises(ValueError, match="outside"):
        c.reclaim_ratio_label(101)


@given(st.integers(0, 100))
def test_every_written_label_reads_as_its_percent(percent: int) -> None:
    label = c.reclaim_ratio_label(percent)
    assert c.koordinator_reclaim_percent(label) == percent and c.KOORDINATOR_READS[percent] == percent
    assert len(label) <= 5  # a short, valid label value


def test_live_room_is_the_measured_level_plus_the_rise_capped_by_the_forecast() -> None:
    # room 10 - 1 = 9; usage 3 + rise 2 = 5, below the forecast 6: 9 - 5
    assert c.live_reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, 2.0, 6.0) == pytest.approx(4.0)
    # the forecast expects no more than 4: only that is reserved
    assert c.live_reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, 2.0, 4.0) == pytest.approx(5.0)
    # never below the measurement, even with the forecast under it
    assert c.live_reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, 2.0, 1.0) == pytest.approx(6.0)
    # no cap (NaN forecast): the whole rise
    assert c.live_reclaimable(10.0, 1.0, 0.0, 0.0, 3.0, 2.0, NAN) == pytest.approx(4.0)
    # no measurement: no live value (the caller serves the forecast-only one)
    assert math.isnan(float(c.live_reclaimable(10.0, 1.0, 0.0, 0.0, NAN, 2.0, 6.0)))
    assert c.live_reclaimable(10.0, 1.0, 0.5, 2.0, 9.0, 2.0, NAN) == 0.0  # over the room: 0, not negative


@given(finite, finite, finite, finite, finite)
def test_live_room_is_bounded(allocatable: float, margin: float, last: float, rise: float, forecast: float) -> None:
    value = float(c.live_reclaimable(allocatable, margin, 0.0, 0.0, last, rise, forecast))
    assert 0.0 <= value <= max(allocatable - margin - last, 0.0) + 1e-6
    uncapped = float(c.live_reclaimable(allocatable, margin, 0.0, 0.0, last, rise, NAN))
    assert value >= uncapped - 1e-6  # the cap only gives room back


def test_usage_threshold_is_lowered_by_the_rise_still_to_come() -> None:
    assert c.usage_threshold_percent(10.0, 65.0, current_usage=3.0, forecast_peak=5.0, floor_percent=30.0) == 45
    assert c.usage_threshold_percent(10.0, 65.0, current_usage=3.0, forecast_peak=8.0, floor_percent=30.0) == 30
    assert c.usage_threshold_percent(10.0, 65.0, current_usage=5.0, forecast_peak=4.0, floor_percent=30.0) == 65


@given(finite, finite, finite, finite, st.floats(0, 1))
def test_offer_is_bounded_by_room_and_never_negative(
    allocatable: float, reservation: float, last: float, limit: float, weight: float
) -> None:
    offer = float(c.reclaimable(allocatable, 0.0, 0.0, 0.0, reservation, last, limit, weight=weight))
    assert 0.0 <= offer <= allocatable + 1e-9
    # never more than the forecast-based value: staleness only takes room away
    assert offer <= float(c.reclaimable(allocatable, 0.0, 0.0, 0.0, reservation, last, limit)) * (1 + 1e-12) + 1e-9
    assert not math.isnan(offer)
