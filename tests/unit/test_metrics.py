"""Scoring math (anchors.md section 6): known answers and properties of the matched-violation search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from models.metrics import (
    matched_alpha,
    overprovision,
    per_container_violation,
    score_line,
    score_peak,
    violation_rate,
)

# Usage in cores or bytes: subnormal floats (below 2.2e-308) are not usage, and alpha x them underflows to 0.
values = arrays(np.float64, st.integers(1, 200), elements=st.floats(0.0, 100.0, allow_subnormal=False))


def test_known_answers() -> None:
    usage = np.array([1.0, 2.0, 3.0, 4.0])
    line = np.array([2.0, 2.0, 2.0, 2.0])
    assert violation_rate(usage, line) == 0.5
    assert overprovision(usage, line) == pytest.approx(8 / 10 - 1)
    assert matched_alpha(usage, line, 0.0) == 2.0  # 4 / 2: nothing may stick out
    assert matched_alpha(usage, line, 0.25) == 1.5  # one sample (4) may
    assert per_container_violation(usage, line, np.array([0, 0, 1, 1])).tolist() == [0.0, 1.0]
    score = score_line(usage, line, np.array([0, 0, 1, 1]), targets=(0.25,))
    assert score.matched[0].overprovision == pytest.approx(1.5 * 8 / 10 - 1)


def test_zero_line_under_usage_can_never_be_matched() -> None:
    assert matched_alpha(np.array([1.0, 1.0]), np.array([0.0, 1.0]), 0.0) == np.inf


def test_peak_score() -> None:
    peak = score_peak(np.array([1.0, 2.0, 4.0]), np.array([2.0, 2.0, 2.0]))
    assert peak.median_absolute_percentage_error == 0.5
    assert peak.exceeded_fraction == pytest.approx(1 / 3)


@settings(max_examples=60, deadline=None)
@given(values, st.floats(0.1, 10.0), st.floats(0.1, 10.0))
def test_violation_is_monotone_in_alpha(usage: np.ndarray, a: float, b: float) -> None:
    line = np.sqrt(usage) + 0.5
    low, high = sorted((a, b))
    assert violation_rate(usage, line, high) <= violation_rate(usage, line, low)
    assert overprovision(usage, line, high) >= overprovision(usage, line, low) or usage.sum() == 0


@settings(max_examples=60, deadline=None)
@given(values, st.sampled_from([0.0, 0.01, 0.05, 0.2]))
def test_matched_alpha_is_the_smallest_that_meets_the_target(usage: np.ndarray, target: float) -> None:
    line = np.abs(np.sin(np.arange(usage.size))) + 0.1
    alpha = matched_alpha(usage, line, target)
    assert violation_rate(usage, line, alpha) <= target + 1e-12
    if alpha > 0:
        assert violation_rate(usage, line, alpha * (1 - 1e-9)) > target
