"""How a line is scored against the usage that followed it (anchors.md section 6). Pure functions on arrays.

Every function takes flat, aligned arrays of samples: `usage` (what a pod used), `line` (what the method said
for that pod at that time) and, where a per-container view is needed, `container` (an integer code per sample).
Samples with missing usage must be dropped by the caller. A line is scaled by `alpha` to separate the shape of a
forecast from its margin: the matched alpha is the smallest one at which the pooled violation rate falls to a target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from recommender.arrays import FloatArray, IntArray


def usage_to_line_ratio(usage: FloatArray, line: FloatArray) -> FloatArray:
    """u / line per sample: a sample violates the line scaled by alpha exactly when its ratio exceeds alpha (a line
    that is not above 0: inf where there is usage, else 0). One division, then only those samples are mended."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio: FloatArray = np.divide(usage, line, dtype=np.float64)
    low = ~(line > 0)
    if low.any():
        ratio[low] = np.where(usage[low] > 0, np.inf, 0.0)
    return ratio


def violation_rate(usage: FloatArray, line: FloatArray, alpha: float = 1.0) -> float:
    """Fraction of samples with usage above alpha x line (0 for no samples), compared as usage / line > alpha so
    that the matched alpha (a ratio itself) is exact in floating point."""
    return _violation_rate(usage_to_line_ratio(usage, line), alpha)


def _violation_rate(ratio: FloatArray, alpha: float) -> float:
    return float(np.count_nonzero(ratio > alpha) / ratio.size) if ratio.size else 0.0


def overprovision(usage: FloatArray, line: FloatArray, alpha: float = 1.0) -> float:
    """sum(alpha x line) / sum(usage) - 1: the room reserved beyond what was used, relative to the usage."""
    return _overprovision(float(np.sum(usage)), float(np.sum(line)), alpha)


def _overprovision(used: float, provisioned: float, alpha: float) -> float:
    if used <= 0:
        return float("inf") if provisioned > 0 else 0.0
    return alpha * provisioned / used - 1.0


def matched_alpha(usage: FloatArray, line: FloatArray, target_violation: float) -> float:
    """The smallest alpha whose pooled violation rate is at most `target_violation` (inf if none is)."""
    return _matched_alpha(usage_to_line_ratio(usage, line), target_violation)


def _matched_alpha(ratio: FloatArray, target_violation: float) -> float:
    if not 0.0 <= target_violation < 1.0:
        raise ValueError("target_violation must be in [0, 1)")
    if ratio.size == 0:
        return 1.0
    allowed = int(np.floor(target_violation * ratio.size + 1e-9))
    rank = ratio.size - 1 - allowed  # the order statistic a full sort would put there, found without one
    return float(max(np.partition(ratio, rank)[rank], 0.0))


def per_container_violation(usage: FloatArray, line: FloatArray, container: IntArray, alpha: float = 1.0) -> FloatArray:
    """Violation rate of each container code that has samples (codes without samples are left out)."""
    return _per_container_violation(usage_to_line_ratio(usage, line), container, alpha)


def _per_container_violation(ratio: FloatArray, container: IntArray, alpha: float) -> FloatArray:
    counts = np.bincount(container)
    above = np.bincount(container[ratio > alpha], minlength=counts.size)
    present = counts > 0
    result: FloatArray = above[present] / counts[present]
    return result


@dataclass(frozen=True)
class MatchedScore:
    """Overprovision of a line scaled to a target pooled violation, with the fairness check beside it."""

    target_violation: float
    alpha: float
    overprovision: float
    p90_container_violation: float


@dataclass(frozen=True)
class LineScore:
    """A line's scores over all its samples (pooled) and across containers."""

    samples: int
    violation: float
    overprovision: float
    p90_container_violation: float
    matched: tuple[MatchedScore, ...]


def score_line(
    usage: FloatArray, line: FloatArray, container: IntArray, targets: tuple[float, ...] = (0.01, 0.05)
) -> LineScore:
    """Raw violation and overprovision, then the same at each matched violation target (the ratios computed once:
    a backtest scores some ten million samples a line)."""
    ratio = usage_to_line_ratio(usage, line)
    used, provisioned = float(np.sum(usage)), float(np.sum(line))
    matched = []
    for target in targets:
        alpha = _matched_alpha(ratio, target)
        matched.append(
            MatchedScore(
                target_violation=target,
                alpha=alpha,
                overprovision=_overprovision(used, provisioned, alpha),
                p90_container_violation=_p90(_per_container_violation(ratio, container, alpha)),
            )
        )
    return LineScore(
        samples=int(usage.size),
        violation=_violation_rate(ratio, 1.0),
        overprovision=_overprovision(used, provisioned, 1.0),
        p90_container_violation=_p90(_per_container_violation(ratio, container, 1.0)),
        matched=tuple(matched),
    )


def _p90(values: FloatArray) -> float:
    return float(np.quantile(values, 0.9)) if values.size else 0.0


@dataclass(frozen=True)
class PeakScore:
    """Peak forecast against the actual max of each container-day."""

    days: int
    median_absolute_percentage_error: float
    exceeded_fraction: float


def score_peak(forecast: FloatArray, actual: FloatArray) -> PeakScore:
    """Median |forecast - actual| / actual (over days with a positive actual) and the share of days above it."""
    positive = actual > 0
    errors = np.abs(forecast[positive] - actual[positive]) / actual[positive]
    return PeakScore(
        days=int(actual.size),
        median_absolute_percentage_error=float(np.median(errors)) if errors.size else 0.0,
        exceeded_fraction=float(np.mean(actual > forecast)) if actual.size else 0.0,
    )


#: A line "moves" from one decision to the next when it changes by more than this factor either way.
CHURN_FACTOR = 1.5


def line_churn(lines: FloatArray, known: npt.NDArray[np.bool_], factor: float = CHURN_FACTOR) -> float:
    """Share of a container's changes from one decision to the next that exceed `factor` either way: `lines` are
    (consecutive decisions x containers) values of a constant line, `known` where a container was decided on. The
    pooled scores judge each decision on its own, so a request that doubles one day and halves the next costs
    nothing in them but churns the pods it is applied to. Pairs where either value is unknown or not above 0 are
    left out; NaN without any pair."""
    before, after = lines[:-1], lines[1:]
    usable = known[:-1] & known[1:] & (before > 0) & (after > 0)
    if not usable.any():
        return float("nan")
    ratio = after[usable] / before[usable]
    return float(np.mean((ratio > factor) | (ratio < 1.0 / factor)))
