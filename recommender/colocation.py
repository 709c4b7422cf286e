"""Reclaimable node resources for colocation: our forecast-based rules and Koordinator's own, as pure array math.

A node's room is split between high-priority pods (prod, mid's owners, none) and the lower-priority pods that borrow
what they leave: koord-batch borrows below the short-term reservation, koord-mid below the long-term one.

Ours (every argument in one unit, cores or bytes, arrays broadcast):
    batch = max(0, allocatable - margin - max(system, reserved) - max(short_term, last_usage + jump))
    mid   = max(0, allocatable - margin - max(system, reserved) - max(long_term, last_usage + jump))
where short_term / long_term are the forecasts of the node's pooled high-priority usage (the forecast of the sum, not
the sum of per-pod forecasts: peaks of different pods rarely coincide), `last_usage` is the newest measured
high-priority usage and `jump` the node's learned rise between two measurements (a high quantile of its 5-minute
increases): a forecast that lags reality never offers room that is in use or about to be. Koordinator keeps a flat
35-40 % of capacity for that rise on every node; we keep what each node's history shows.
A measurement older than `fresh_seconds` stops flooring the offer (the forecast carries on over its horizon, with a
wider margin: `unmeasured_margin`, chosen on validation days so that the forecast alone is as safe); once
the forecast itself runs past its horizon, both values decay toward the conservative one (the room high-priority
pods did not request at all: `allocatable - margin - max(system, reserved) - limit`) with a half-life, instead of
Koordinator's drop to 0.

Koordinator's (anchors.md section 1), for comparison:
    batch = max(0, capacity x threshold% - max(system, reserved) - HP)
with HP by policy: "usage" (sum of pods' recent usage, their request where a pod has no metrics), "request" (sum of
requests), "maxUsageRequest" (sum of max(request, usage) per pod); batch is 0 once node metrics are older than
15 minutes. Mid: sum(max(0, request - peak)) over pods, capped by allocatable - sum(peak), each pod's peak its
decayed p95 (CPU) / p98 (memory) x 1.10, pods younger than 24 h counting their full request.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from recommender.arrays import FloatArray

ArrayLike = float | FloatArray
KoordinatorPolicy = Literal["usage", "request", "maxUsageRequest"]
KOORDINATOR_POLICIES: tuple[KoordinatorPolicy, ...] = ("usage", "request", "maxUsageRequest")
#: Koordinator removes batch resources when node metrics are older than this, seconds.
KOORDINATOR_DEGRADE_SECONDS = 15 * 60
#: Koordinator's mid rule: a pod younger than this reclaims nothing, seconds.
KOORDINATOR_MID_MIN_AGE_SECONDS = 24 * 3600
NODE_RECLAIM_LABEL = {
    "cpu": "node.koordinator.sh/cpu-reclaim-ratio",
    "memory": "node.koordinator.sh/memory-reclaim-ratio",
}


def _floor0(values: ArrayLike) -> FloatArray:
    result: FloatArray = np.maximum(np.asarray(values, dtype=np.float64), 0.0)
    return result


def staleness_weight(age_seconds: ArrayLike, fresh_seconds: float, half_life_seconds: float) -> FloatArray:
    """1 while the data is at most `fresh_seconds` old, then halving every `half_life_seconds` of further age."""
    late = np.maximum(np.asarray(age_seconds, dtype=np.float64) - fresh_seconds, 0.0)
    result: FloatArray = np.exp2(-late / half_life_seconds)
    return result


def room(allocatable: ArrayLike, margin: ArrayLike, system: ArrayLike, reserved: ArrayLike) -> FloatArray:
    """What high-priority and borrowing pods share: allocatable - margin - max(system, reserved)."""
    result: FloatArray = np.asarray(allocatable, dtype=np.float64) - margin - np.maximum(system, reserved)
    return result


def reclaimable(
    allocatable: ArrayLike,
    margin: ArrayLike,
    system: ArrayLike,
    reserved: ArrayLike,
    reservation: ArrayLike,
    last_usage: ArrayLike,
    limit: ArrayLike,
    jump: ArrayLike = 0.0,
    weight: ArrayLike = 1.0,
    unmeasured_margin: ArrayLike | None = None,
) -> FloatArray:
    """Our batch (with the short-term reservation) or mid (with the long-term one) allocatable, floored at 0.

    `weight` (from `staleness_weight`) blends the forecast-based value with the conservative one
    (`limit` = the high-priority requests in place of the forecast): 1 is fresh data, 0 is no trust left.
    `unmeasured_margin` replaces `margin` where `last_usage` is NaN: with no fresh measurement the forecast alone
    carries the offer, and its day-ahead error is larger than the 5-minute rise the measured floor covers.
    """
    if unmeasured_margin is not None:
        margin = np.where(np.isnan(np.asarray(last_usage, dtype=np.float64)), unmeasured_margin, margin)
    shared = room(allocatable, margin, system, reserved)
    requested = np.nan_to_num(np.asarray(limit, dtype=np.float64))
    # With neither a forecast nor a measurement, the requests are all we know.
    expected = np.fmax(reservation, np.asarray(last_usage, dtype=np.float64) + np.nan_to_num(jump))
    forecast = _floor0(shared - np.where(np.isnan(expected), requested, expected))
    conservative = _floor0(shared - requested)
    w = np.asarray(weight, dtype=np.float64)
    result: FloatArray = w * forecast + (1.0 - w) * np.minimum(conservative, forecast)
    return result


def koordinator_hp_used(
    policy: KoordinatorPolicy, usage: FloatArray, request: FloatArray, axis: int = -1
) -> FloatArray:
    """Koordinator's HPUsed over the pods along `axis`: per pod its usage (NaN = no metrics: its request), its
    request, or the max of both."""
    request = np.nan_to_num(np.asarray(request, dtype=np.float64))
    if policy == "request":
        per_pod = request
    elif policy == "usage":
        per_pod = np.where(np.isnan(usage), request, usage)
    elif policy == "maxUsageRequest":
        per_pod = np.fmax(usage, request)
    else:
        raise ValueError(f"unknown Koordinator batch policy {policy!r}")
    result: FloatArray = np.sum(per_pod, axis=axis)
    return result


def koordinator_batch(
    capacity: ArrayLike,
    reclaim_percent: ArrayLike,
    system: ArrayLike,
    reserved: ArrayLike,
    hp_used: ArrayLike,
    metrics_age_seconds: ArrayLike = 0.0,
) -> FloatArray:
    """Koordinator's batch allocatable: capacity x threshold% - max(system, reserved) - HPUsed, 0 on stale metrics."""
    value = (
        np.asarray(capacity, dtype=np.float64) * np.asarray(reclaim_percent) / 100.0
        - np.maximum(system, reserved)
        - hp_used
    )
    fresh = np.asarray(metrics_age_seconds, dtype=np.float64) <= KOORDINATOR_DEGRADE_SECONDS
    result: FloatArray = np.where(fresh, _floor0(value), 0.0)
    return result


def koordinator_mid(
    allocatable: ArrayLike, request: FloatArray, peak: FloatArray, age_seconds: FloatArray, axis: int = -1
) -> FloatArray:
    """Koordinator's mid reclaimable over the pods along `axis` (NaN requests or peaks count as absent pods)."""
    request = np.asarray(request, dtype=np.float64)
    young = np.asarray(age_seconds, dtype=np.float64) < KOORDINATOR_MID_MIN_AGE_SECONDS
    present = ~np.isnan(request)
    own_peak = np.where(young | np.isnan(peak), request, peak)
    unused = np.where(present, np.maximum(request - own_peak, 0.0), 0.0).sum(axis=axis)
    peaks = np.where(present, own_peak, 0.0).sum(axis=axis)
    result: FloatArray = _floor0(np.minimum(unused, np.asarray(allocatable, dtype=np.float64) - peaks))
    return result


def reclaim_ratio(capacity: ArrayLike, margin: ArrayLike, rise: ArrayLike, jump: ArrayLike) -> FloatArray:
    """The node's `<resource>-reclaim-ratio` label value: Koordinator then offers `capacity x ratio - max(system,
    reserved) - HPUsed` with its own live HPUsed; with `capacity x (1 - ratio) = margin + max(rise, jump)` that is
    `allocatable - margin - (live usage + the rise our forecast expects over the batch window, at least `jump`, a
    5-minute rise: the writer passes the node's largest of the week, since Koordinator acts on a step-old
    measurement)`. Koordinator supplies the level, our forecast the headroom. Within [0, 1], rounded down
    to a whole percent (Koordinator reads the label as one), so rounding never takes headroom away."""
    capacity = np.asarray(capacity, dtype=np.float64)
    headroom = np.asarray(margin, dtype=np.float64) + np.fmax(np.maximum(rise, 0.0), jump)
    ratio = np.where(capacity > 0, np.clip(1.0 - headroom / np.where(capacity > 0, capacity, 1.0), 0.0, 1.0), 0.0)
    # The small epsilon keeps 0.75 from flooring to 0.74 through binary rounding.
    result: FloatArray = np.floor(ratio * 100 + 1e-9) / 100
    return result


def usage_threshold_percent(
    allocatable: float, default_percent: float, current_usage: float, forecast_peak: float, floor_percent: float
) -> int:
    """The LoadAware usage threshold for a node: the default lowered by the rise the forecast expects over the window
    (so Koordinator's scheduler, which sees only current usage, keeps room for a peak still to come)."""
    if allocatable <= 0:
        return int(round(default_percent))
    rise = max(forecast_peak - current_usage, 0.0) / allocatable * 100.0
    return int(round(min(max(default_percent - rise, floor_percent), default_percent)))
