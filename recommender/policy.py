"""Recommendation policy: how histogram percentiles become target, lower bound, upper bound and uncapped target.

VPA's rule (anchors.md section 2): estimate = percentile x (1 + margin); the lower bound shrinks and the upper bound
widens by (1 + multiplier / days)^exponent while the history is short; every value is floored at the per-pod
minimum split across the pod's containers; the target is then clamped to the allowed range (the uncapped target
keeps the value before that). Works on arrays: one element per workload container.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

from recommender.arrays import FloatArray
from recommender.settings import PolicySettings


@dataclass(frozen=True)
class RequestBounds:
    """One resource's request recommendation for many containers (parallel arrays, same unit as the input)."""

    target: FloatArray
    lower_bound: FloatArray
    upper_bound: FloatArray
    uncapped_target: FloatArray


def confidence_multiplier(days: FloatArray, multiplier: float, exponent: float, min_days: float) -> FloatArray:
    """(1 + multiplier / days) ^ exponent, with days floored at min_days so new workloads get finite bounds."""
    result: FloatArray = np.power(1.0 + multiplier / np.maximum(days, min_days), exponent)
    return result


def request_bounds(
    lower_percentile_value: FloatArray,
    target_percentile_value: FloatArray,
    upper_percentile_value: FloatArray,
    confidence_days: FloatArray,
    containers_per_pod: FloatArray,
    pod_minimum: float,
    min_allowed: float | None,
    max_allowed: float | None,
    policy: PolicySettings,
) -> RequestBounds:
    """Apply VPA's margin, confidence multipliers, per-pod floor and allowed range to histogram percentiles."""
    margin = 1.0 + policy.safety_margin_fraction
    floor = pod_minimum / np.maximum(containers_per_pod, 1.0)
    target = np.maximum(target_percentile_value * margin, floor)
    lower = (
        lower_percentile_value
        * margin
        * confidence_multiplier(
            confidence_days,
            policy.lower_bound_confidence_multiplier,
            policy.lower_bound_confidence_exponent,
            policy.min_confidence_days,
        )
    )
    upper = (
        upper_percentile_value
        * margin
        * confidence_multiplier(
            confidence_days,
            policy.upper_bound_confidence_multiplier,
            policy.upper_bound_confidence_exponent,
            policy.min_confidence_days,
        )
    )
    lower, upper = np.maximum(lower, floor), np.maximum(upper, floor)
    low = -np.inf if min_allowed is None else min_allowed
    high = np.inf if max_allowed is None else max_allowed
    return RequestBounds(
        target=np.clip(target, low, high),
        lower_bound=np.clip(lower, low, high),
        upper_bound=np.clip(upper, low, high),
        uncapped_target=target,
    )


def with_target(
    bounds: RequestBounds, target: FloatArray, floor: FloatArray, min_allowed: float | None, max_allowed: float | None
) -> RequestBounds:
    """Replace the target by a forecast (NaN keeps VPA's), floored and clamped alike; the bounds widen to hold it."""
    uncapped = np.where(np.isnan(target), bounds.uncapped_target, np.maximum(target, floor))
    low = -np.inf if min_allowed is None else min_allowed
    high = np.inf if max_allowed is None else max_allowed
    capped = np.clip(uncapped, low, high)
    return RequestBounds(
        target=capped,
        lower_bound=np.minimum(bounds.lower_bound, capped),
        upper_bound=np.maximum(bounds.upper_bound, capped),
        uncapped_target=uncapped,
    )


def request_policy_for(namespace: str, workload: str, policy: PolicySettings) -> str:
    """`forecast` or `vpa` for a workload: the first rule whose globs match it, else the global setting."""
    for rule in policy.request_policy_rules:
        if fnmatch.fnmatchcase(namespace, rule.namespace) and fnmatch.fnmatchcase(workload, rule.workload):
            return rule.policy
    return policy.request_policy
