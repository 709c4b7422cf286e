"""Reclaimable node resources: every formula of `recommender.colocation` on hand-computed nodes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from recommender import colocation as c

NAN = float("nan")


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


def test_koordinator_mid_reclaims_unused_requests_capped_by_what_peaks_leave() -> None:
    request = np.array([4.0, 3.0, 2.0])
    peak = np.array([1.0, 2.5, 0.1])
    day = 86400.0
    age = np.array([2 * day, 2 * day, 3600.0])  # the third pod is young: it counts its full request
    # unused = 3 + 0.5 + 0; peaks = 1 + 2.5 + 2 = 5.5
    assert c.koordinator_mid(10.0, request, peak, age) == pytest.approx(3.5)
    assert c.koordinator_mid(8.0, request, peak, age) == pytest.approx(2.5)
    # a departed pod (NaN request) counts for nothing
    assert c.koordinator_mid(
        10.0, np.array([4.0, NAN]), np.array([1.0, 1.0]), np.array([2 * day, 2 * day])
    ) == pytest.approx(3.0)


def test_reclaim_ratio_gives_koordinator_our_headroom_over_its_live_usage() -> None:
    # capacity 10, margin 1, forecast rise 1.5 over the window, rise allowance 0.5: headroom 2.5
    ratio = float(c.reclaim_ratio(10.0, 1.0, 1.5, 0.5))
    assert ratio == pytest.approx(0.75)
    # Koordinator with that ratio, reserved 1 (allocatable 9) and live usage 3: 9 - 1 - (3 + 1.5)
    assert c.koordinator_batch(10.0, ratio * 100, 0.0, 1.0, 3.0) == pytest.approx(3.5)
    assert float(c.reclaim_ratio(10.0, 1.0, -2.0, 0.5)) == pytest.approx(0.85)  # a falling forecast: the allowance
    # rounded down to a whole percent, never up: 1 - 1.234 / 10 = 0.8766 -> 0.87
    assert float(c.reclaim_ratio(10.0, 1.0, 0.234, 0.0)) == pytest.approx(0.87)
    assert float(c.reclaim_ratio(10.0, 30.0, 0.0, 0.0)) == 0.0
    assert float(c.reclaim_ratio(0.0, 1.0, 0.0, 0.0)) == 0.0


def test_usage_threshold_is_lowered_by_the_rise_still_to_come() -> None:
    assert c.usage_threshold_percent(10.0, 65.0, current_usage=3.0, forecast_peak=5.0, floor_percent=30.0) == 45
    assert c.usage_threshold_percent(10.0, 65.0, current_usage=3.0, forecast_peak=8.0, floor_percent=30.0) == 30
    assert c.usage_threshold_percent(10.0, 65.0, current_usage=5.0, forecast_peak=4.0, floor_percent=30.0) == 65


finite = st.floats(0, 1e6, allow_nan=False)


@given(finite, finite, finite, finite, st.floats(0, 1))
def test_offer_is_bounded_by_room_and_never_negative(
    allocatable: float, reservation: float, last: float, limit: float, weight: float
) -> None:
    offer = float(c.reclaimable(allocatable, 0.0, 0.0, 0.0, reservation, last, limit, weight=weight))
    assert 0.0 <= offer <= allocatable + 1e-9
    # never more than the forecast-based value: staleness only takes room away
    assert offer <= float(c.reclaimable(allocatable, 0.0, 0.0, 0.0, reservation, last, limit)) * (1 + 1e-12) + 1e-9
    assert not math.isnan(offer)
