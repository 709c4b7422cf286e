"""Hand-computed cases for VPA's recommendation policy: margin, confidence multipliers, floors, allowed range."""

from __future__ import annotations

import numpy as np
import pytest

from recommender.policy import confidence_multiplier, request_bounds
from recommender.settings import PolicySettings

MIB = 1024.0**2


def bounds(p50: float, p90: float, p95: float, days: float, containers: float = 1, **policy: float):  # type: ignore[no-untyped-def]
    settings = PolicySettings(**policy)
    return request_bounds(
        np.array([p50]),
        np.array([p90]),
        np.array([p95]),
        np.array([days]),
        np.array([containers]),
        pod_minimum=0.025,
        min_allowed=settings.min_allowed_cpu_cores,
        max_allowed=settings.max_allowed_cpu_cores,
        policy=settings,
    )


def test_target_is_p90_plus_15_percent() -> None:
    assert bounds(0.5, 1.0, 2.0, days=8).target[0] == pytest.approx(1.15)


def test_lower_bound_confidence_after_one_day() -> None:
    # p50 x 1.15 x (1 + 0.001 / 1)^-2
    assert bounds(0.5, 1.0, 2.0, days=1).lower_bound[0] == pytest.approx(0.5 * 1.15 / 1.001**2)


def test_upper_bound_confidence_after_half_a_day_and_after_long_history() -> None:
    # p95 x 1.15 x (1 + 1 / 0.5): three times the margin-adjusted p95 while history is short...
    assert bounds(0.5, 1.0, 2.0, days=0.5).upper_bound[0] == pytest.approx(2.0 * 1.15 * 3.0)
    # ...and close to it after 100 days.
    assert bounds(0.5, 1.0, 2.0, days=100).upper_bound[0] == pytest.approx(2.0 * 1.15 * 1.01)


def test_zero_history_gives_finite_bounds() -> None:
    result = bounds(0.5, 1.0, 2.0, days=0.0)
    # Floored at one hour (1/24 day): (1 + 24) = 25x, never infinity.
    assert result.upper_bound[0] == pytest.approx(2.0 * 1.15 * 25.0)
    assert confidence_multiplier(np.array([0.0]), 1.0, 1.0, min_days=1 / 24)[0] == pytest.approx(25.0)


def test_pod_minimum_is_split_across_containers() -> None:
    result = bounds(0.0, 0.001, 0.002, days=8, containers=2)
    assert result.target[0] == pytest.approx(0.0125)
    assert result.lower_bound[0] == pytest.approx(0.0125)
    assert result.upper_bound[0] == pytest.approx(0.0125)


def test_allowed_range_caps_target_but_not_uncapped_target() -> None:
    result = bounds(0.5, 1.0, 2.0, days=8, max_allowed_cpu_cores=1.0)
    assert result.target[0] == 1.0
    assert result.upper_bound[0] == 1.0
    assert result.uncapped_target[0] == pytest.approx(1.15)
    raised = bounds(0.01, 0.02, 0.03, days=8, min_allowed_cpu_cores=0.5)
    assert raised.target[0] == raised.lower_bound[0] == 0.5


def test_percentiles_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="lower_bound <= target <= upper_bound"):
        PolicySettings(target_percentile=0.99, upper_bound_percentile=0.95)
