"""Scoring math (anchors.md section 6): known answers and properties of the matched-violation search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from models.metrics import (
    line_churn,
    matched_alpha,
    overprovision,
    per_container_violation,
    score_line,
    score_peak,
    usage_to_line_ratio,
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


def test_line_churn_known_answers() -> None:
    lines = np.array([[1.0, 2.0, 1.0], [2.0, 2.0, 1.4], [1.0, 0.0, 1.0], [1.0, 2.0, np.nan]])
    known = np.ones(lines.shape, dtype=bool)
    # Pairs: container 0: 2x, 0.5x, 1x; container 1: 1x, (to 0: left out), (from 0: left out); container 2:
    # 1.4x, 1/1.4x, (to NaN: left out). Beyond 1.5x either way: 2 of 6.
    assert line_churn(lines, known) == pytest.approx(2 / 6)
    known[1, 0] = False  # container 0 not decided on the second day: its first two pairs go
    assert line_churn(lines, known) == pytest.approx(0 / 4)
    assert line_churn(lines, known, factor=1.3) == pytest.approx(2 / 4)
    assert np.isnan(line_churn(lines[:1], known[:1]))


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 8), st.integers(1, 6)),
        elements=st.one_of(st.just(np.nan), st.just(0.0), st.floats(1e-3, 1e3)),
    ),
    st.floats(0.01, 100.0),
)
def test_line_churn_is_a_share_blind_to_units_and_to_the_direction_of_time(lines: np.ndarray, scale: float) -> None:
    known = ~np.isnan(lines)
    churn = line_churn(lines, known)
    assert np.isnan(churn) or 0.0 <= churn <= 1.0
    # A change beyond the factor one way is one beyond it the other way (ratios on the factor's edge excepted).
    ratios = lines[1:] / np.where(lines[:-1] > 0, lines[:-1], np.nan)
    if not np.any(np.isclose(ratios, 1.5) | np.isclose(ratios, 1 / 1.5)):
        np.testing.assert_equal(line_churn(lines[::-1], known[::-1]), churn)
        np.testing.assert_equal(line_churn(lines * scale, known), churn)


def _ratio_by_definition(usage: np.ndarray, line: np.ndarray) -> np.ndarray:
    """usage / line where the line is above 0; elsewhere (0, below 0 or unknown) inf where there is usage, else 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio: np.ndarray = np.where(line > 0, usage / np.where(line > 0, line, 1.0), np.where(usage > 0, np.inf, 0.0))
    return ratio


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 300), st.integers(0, 2**31), st.sampled_from([0.0, 0.1, 0.5]))
def test_score_line_is_its_definitions_on_ratios_computed_once(n: int, seed: int, low: float) -> None:
    """Shares of a line's lows (0 or below 0) and idle samples; the matched alpha is the sorted order statistic."""
    rng = np.random.default_rng(seed)
    usage = rng.gamma(1.0, 1.0, n) * (rng.random(n) > 0.1)
    line = rng.gamma(2.0, 1.0, n)
    bad = rng.random(n) < low
    line[bad] = rng.choice([0.0, -1.0], size=int(bad.sum()))
    container = rng.integers(0, 7, n)
    unknown = line.copy()
    unknown[bad] = np.nan
    np.testing.assert_array_equal(usage_to_line_ratio(usage, unknown), _ratio_by_definition(usage, unknown))
    ratio = _ratio_by_definition(usage, line)
    scores = score_line(usage, line, container)

    def p90(alpha: float) -> float:
        return float(np.quantile([np.mean(ratio[container == c] > alpha) for c in np.unique(container)], 0.9))

    used = float(np.sum(usage))
    assert scores.violation == pytest.approx(float(np.mean(ratio > 1.0)))
    assert scores.p90_container_violation == pytest.approx(p90(1.0))
    if used > 0:
        assert scores.overprovision == pytest.approx(float(np.sum(line)) / used - 1.0)
    for matched in scores.matched:
        allowed = int(np.floor(matched.target_violation * n + 1e-9))
        assert matched.alpha == max(np.sort(ratio)[n - 1 - allowed], 0.0)
        assert matched.p90_container_violation == pytest.approx(p90(matched.alpha))
