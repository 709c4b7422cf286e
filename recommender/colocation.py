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

Live (what `recommender live` serves, updated every few minutes from the node's newest high-priority usage):
    batch = max(0, allocatable - margin - max(system, reserved) - max(last_usage, min(last_usage + rise, forecast)))
the measured level plus only the rise possible before the next update, optionally capped by the short-term forecast
(off by default: capped, the held-out violations were several times Koordinator's) but never below the measured usage
itself; `live_reclaimable`. `rise` depends on the level (`level_rise`): the largest 5-minute rise the node showed in
the last days from a level near the current one (Mondrian by node and level band: a node idling can jump by a whole
burst, a node already busy only by what is left), a table the daily training learns (`models.nodes.level_rise_table`),
plus a factor times the node's climb into the newest measurement (`climbing_rise`: a burst that ramps over several
steps goes on). With a learned live line of the node's pooled usage (`line_reclaimable`), the reserved usage is the larger of the
level plus its rise and the line:
    batch = max(0, allocatable - margin - max(system, reserved) - max(last_usage + rise, factor x line)).

Koordinator's, for comparison and for what we write for it (its source, koordinator-sh/koordinator; docs/benchmarks.md
"Node colocation backtest" cites each rule):
    batch = max(0, capacity x threshold% - max(system, reserved) - HPUsed)
(slo-controller `plugins/util/util.go` CalculateBatchResourceByPolicy) with HPUsed by policy: "usage" (sum of pods'
recent usage, their request where a pod has no metrics), "maxUsageRequest" (sum of max(request, usage) per pod), and
for memory only "request" (sum of requests): CPU has no request policy. Batch and mid are reset once node metrics are
older than 15 minutes (degradeTimeMinutes). The reclaim-ratio label is read as `int64(float64(label) x 100)` percent
(`sloconfig` getNodeReclaimPercent): truncated, so "0.29" is 28 %. Mid: `koordinator_mid`.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from recommender.arrays import FloatArray, IntArray

ArrayLike = float | FloatArray
KoordinatorPolicy = Literal["usage", "request", "maxUsageRequest"]
KOORDINATOR_POLICIES: tuple[KoordinatorPolicy, ...] = ("usage", "request", "maxUsageRequest")
#: The batch policies Koordinator accepts per resource: cpuCalculatePolicy is "usage" or "maxUsageRequest" only.
KOORDINATOR_RESOURCE_POLICIES: dict[str, tuple[KoordinatorPolicy, ...]] = {
    "cpu": ("usage", "maxUsageRequest"),
    "memory": KOORDINATOR_POLICIES,
}
#: Koordinator resets batch and mid resources when node metrics are older than this (degradeTimeMinutes), seconds.
KOORDINATOR_DEGRADE_SECONDS = 15 * 60
#: koordlet's prediction: a pod younger than this (ColdStartDuration) is left out of the per-pod predictor, seconds.
KOORDINATOR_MID_COLD_START_SECONDS = 24 * 3600
#: koordlet's SafetyMarginPercent: predicted peaks are scaled by 1 + this / 100.
KOORDINATOR_MID_SAFETY_MARGIN_PERCENT = 10.0
#: Percentiles of koordlet's peak predictor: p95 for CPU, p98 for memory.
KOORDINATOR_MID_QUANTILE = {"cpu": 0.95, "memory": 0.98}
#: Half-lives of koordlet's decaying histograms (CPUHistogramDecayHalfLife, MemoryHistogramDecayHalfLife), seconds.
KOORDINATOR_MID_HALF_LIFE_SECONDS = {"cpu": 12 * 3600, "memory": 24 * 3600}
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
    capacity: ArrayLike,
    request: FloatArray,
    peak: FloatArray,
    age_seconds: FloatArray,
    pooled_peak: ArrayLike,
    node_usage: ArrayLike,
    metrics_age_seconds: ArrayLike = 0.0,
    safety_margin_percent: ArrayLike = KOORDINATOR_MID_SAFETY_MARGIN_PERCENT,
    threshold_percent: ArrayLike = 100.0,
    unallocated_percent: ArrayLike = 0.0,
    axis: int = -1,
) -> FloatArray:
    """Koordinator's mid allocatable of a node, from its high-priority (prod and none) pods along `axis`.

    Inputs, all in one unit (cores or bytes) except ages (seconds) and percents: `request` per pod (NaN: the pod is
    not on the node), `peak` its predicted p95 (CPU) / p98 (memory) usage from koordlet's decaying histogram,
    `age_seconds` since it started, `pooled_peak` the same percentile of the node's pooled items (system usage plus
    the prod and none priority totals, each its own histogram, summed), `node_usage` the node's last reported usage.
    As koordlet's `minPredictor` and the slo-controller's MidResource plugin compute it:
    - per pod (podReclaimablePredictor): pods older than the cold start add max(0, request - peak') to the reclaimable
      and peak' to the unreclaimable, peak' = peak x (1 + margin); younger ones add nothing to either;
      result min(capacity - unreclaimable, reclaimable), floored at 0;
    - pooled (priorityReclaimablePredictor): every pod's request against pooled_peak x (1 + margin):
      min(capacity - that, max(0, requests - that));
    - prodReclaimable = the smaller of the two; mid = min(prodReclaimable, capacity x threshold%, capacity - node
      usage), floored at 0, plus the unallocated requests x unallocated% (default 0); 0 once the node's metrics are
      older than the degrade time.
    """
    request = np.asarray(request, dtype=np.float64)
    scale = 1.0 + np.asarray(safety_margin_percent, dtype=np.float64) / 100.0
    scale_pods = np.expand_dims(scale, axis) if np.ndim(scale) else scale
    present = ~np.isnan(request)
    mature = (
        present & ~np.isnan(peak) & (np.asarray(age_seconds, dtype=np.float64) > KOORDINATOR_MID_COLD_START_SECONDS)
    )
    own_peak = np.where(mature, np.asarray(peak, dtype=np.float64) * scale_pods, 0.0)
    capacity = np.asarray(capacity, dtype=np.float64)
    pods_reclaimable = np.where(mature, np.maximum(np.nan_to_num(request) - own_peak, 0.0), 0.0).sum(axis=axis)
    per_pod = np.minimum(_floor0(capacity - own_peak.sum(axis=axis)), pods_reclaimable)
    requested = np.where(present, request, 0.0).sum(axis=axis)
    pooled = np.asarray(pooled_peak, dtype=np.float64) * scale
    per_priority = np.minimum(_floor0(capacity - pooled), _floor0(requested - pooled))
    prod_reclaimable = np.minimum(per_pod, per_priority)
    mid = _floor0(
        np.minimum(
            np.minimum(prod_reclaimable, capacity * np.asarray(threshold_percent) / 100.0),
            capacity - np.asarray(node_usage, dtype=np.float64),
        )
    )
    mid = mid + _floor0(capacity - requested) * np.asarray(unallocated_percent) / 100.0
    fresh = np.asarray(metrics_age_seconds, dtype=np.float64) <= KOORDINATOR_DEGRADE_SECONDS
    result: FloatArray = np.where(fresh, mid, 0.0)
    return result


def reclaim_percent(capacity: ArrayLike, margin: ArrayLike, rise: ArrayLike, jump: ArrayLike) -> FloatArray:
    """The whole percent our `<resource>-reclaim-ratio` label gives Koordinator: it then offers `capacity x percent
    / 100 - max(system, reserved) - HPUsed` with its own live HPUsed; with `capacity x (1 - percent / 100) = margin +
    max(rise, jump)` that is `allocatable - margin - (live usage + the rise our forecast expects over the batch
    window, at least `jump`, a 5-minute rise: the writer passes the node's largest of the week, since Koordinator acts
    on a step-old measurement)`. Koordinator supplies the level, our forecast the headroom. Within [0, 100], rounded
    down (Koordinator keeps whole percents), so rounding never takes headroom away; `reclaim_ratio_label` writes it."""
    capacity = np.asarray(capacity, dtype=np.float64)
    headroom = np.asarray(margin, dtype=np.float64) + np.fmax(np.maximum(rise, 0.0), jump)
    ratio = np.where(capacity > 0, np.clip(1.0 - headroom / np.where(capacity > 0, capacity, 1.0), 0.0, 1.0), 0.0)
    # The small epsilon keeps 0.75 from flooring to 74 through binary rounding.
    result: FloatArray = np.floor(ratio * 100 + 1e-9)
    return result


def koordinator_reclaim_percent(label: str) -> int | None:
    """What Koordinator makes of a reclaim-ratio label: `int64(ParseFloat(label) x 100)`, truncated toward zero (so
    "0.29", 28.999... in binary, is 28); None (the label is ignored) when it is not a number or negative."""
    try:
        value = float(label)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value * 100)


def reclaim_ratio_label(percent: int) -> str:
    """The label text Koordinator reads as exactly `percent` (0-100): two decimals where their truncation gives it,
    else the value a thousandth above ("0.291" for 29 %, since "0.29" reads as 28; tested for every percent)."""
    if not 0 <= percent <= 100:
        raise ValueError(f"reclaim percent {percent} is outside 0-100")
    text = f"{percent / 100:.2f}"
    return text if koordinator_reclaim_percent(text) == percent else f"{(percent + 0.1) / 100:.3f}"


#: For each whole percent we write, the percent Koordinator applies (equal by construction; the backtest credits it).
KOORDINATOR_READS = np.array([koordinator_reclaim_percent(reclaim_ratio_label(p)) for p in range(101)], dtype=float)


#: Level bins of a node's live rise table (`level_rise`): each 1 % of the node's reference level.
LEVEL_BINS = 100


def level_bin(level: ArrayLike, reference: ArrayLike) -> IntArray:
    """The bin of each `level` (cores or bytes) in a rise table over [0, `reference`) in `LEVEL_BINS` equal bins; a
    level at or above the reference falls in the last bin, a NaN level or a reference of 0 in the first."""
    ref = np.asarray(reference, dtype=np.float64)
    share = np.nan_to_num(np.asarray(level, dtype=np.float64) / np.where(ref > 0, ref, np.inf))
    result: IntArray = np.clip(np.floor(share * LEVEL_BINS), 0, LEVEL_BINS - 1).astype(np.int64)
    return result


def level_rise(table: FloatArray, level: ArrayLike, reference: ArrayLike) -> FloatArray:
    """The rise a node's `table` (..., LEVEL_BINS) allows above each `level` (..., k): its value at the level's bin
    (`level_bin`), in the table's unit."""
    bins = level_bin(level, np.expand_dims(np.asarray(reference, dtype=np.float64), -1))
    result: FloatArray = np.take_along_axis(np.asarray(table, dtype=np.float64), bins, axis=-1)
    return result


def activity_rise(
    tables: tuple[FloatArray, FloatArray, FloatArray],
    edge: ArrayLike,
    activity: ArrayLike,
    level: ArrayLike,
    reference: ArrayLike,
) -> FloatArray:
    """`level_rise` by a node's split tables (the whole, the calm steps' and the active steps' one, each nodes x
    LEVEL_BINS): the calm table where the node's `activity` (nodes x k, with the level) is at most its `edge`
    (nodes), the active one above it, the whole table where either is unknown (NaN)."""
    whole, calm, active = (level_rise(table, level, reference) for table in tables)
    now = np.asarray(activity, dtype=np.float64)
    bound = np.asarray(edge, dtype=np.float64)[:, None]
    result: FloatArray = np.where(np.isnan(now) | np.isnan(bound), whole, np.where(now <= bound, calm, active))
    return result


def climbing_rise(rise: ArrayLike, climb: ArrayLike, factor: float) -> FloatArray:
    """The rise kept above a live level: the rise table's (`level_rise`) plus `factor` times the node's `climb`, how
    far its pooled usage rose into the newest measurement from the one a step before (a fall, or an unknown climb,
    NaN, adds nothing). A node that has just started to climb may go on: the fleet's memory bursts ramp over two or
    more 5-minute steps, which a table binned by level alone does not see coming."""
    step = np.maximum(np.nan_to_num(np.asarray(climb, dtype=np.float64)), 0.0)
    result: FloatArray = np.asarray(rise, dtype=np.float64) + factor * step
    return result


def live_reclaimable(
    allocatable: ArrayLike,
    margin: ArrayLike,
    system: ArrayLike,
    reserved: ArrayLike,
    last_usage: ArrayLike,
    rise: ArrayLike,
    forecast: ArrayLike,
) -> FloatArray:
    """The batch (short-term `forecast`) or mid (long-term) room served between live updates, floored at 0.

    `last_usage` is the node's newest measured high-priority usage (a pod without metrics at its request, as
    Koordinator counts it), `rise` the most it can climb before the next update (`level_rise` of that level),
    `forecast` our short-term line over that interval, the cap (NaN: no cap, the default); all in cores or bytes. The
    reserved usage is the measured level plus the rise, capped by the forecast where one is given and never below the
    measurement. NaN where `last_usage` is NaN:
    with no fresh measurement the caller serves the forecast-only value (`reclaimable`) instead.
    """
    last = np.asarray(last_usage, dtype=np.float64)
    expected = np.maximum(last, np.fmin(last + np.asarray(rise, dtype=np.float64), forecast))
    return _room_above(allocatable, margin, system, reserved, last, expected)


def line_reclaimable(
    allocatable: ArrayLike,
    margin: ArrayLike,
    system: ArrayLike,
    reserved: ArrayLike,
    last_usage: ArrayLike,
    rise: ArrayLike,
    line: ArrayLike,
) -> FloatArray:
    """The live room with a learned line of the node's pooled high-priority usage over the next update (the live
    line, `models.live_line`, times its factor): the reserved usage is the larger of the measured level plus its rise
    (`live_reclaimable`'s) and the line. The rise keeps the jumps this node made from about this level (which a fleet
    model of the level cannot tell apart); the line adds what recent and past days say is coming (a morning ramp),
    which the rise tables, blind to time, do not. A NaN line leaves the rise tables' room (no fitted line, a cold
    start); NaN where `last_usage` is NaN, as `live_reclaimable`."""
    last = np.asarray(last_usage, dtype=np.float64)
    expected = np.fmax(np.maximum(last, last + np.asarray(rise, dtype=np.float64)), line)
    return _room_above(allocatable, margin, system, reserved, last, expected)


def _room_above(
    allocatable: ArrayLike,
    margin: ArrayLike,
    system: ArrayLike,
    reserved: ArrayLike,
    last: FloatArray,
    expected: ArrayLike,
) -> FloatArray:
    """The live room above the `expected` usage, floored at 0; NaN where the newest measurement `last` is NaN."""
    result: FloatArray = _floor0(room(allocatable, margin, system, reserved) - np.asarray(expected, dtype=np.float64))
    return np.where(np.isnan(last), np.nan, result)


def usage_threshold_percent(
    allocatable: float, default_percent: float, current_usage: float, forecast_peak: float, floor_percent: float
) -> int:
    """The LoadAware usage threshold for a node: the default lowered by the rise the forecast expects over the window
    (so Koordinator's scheduler, which sees only current usage, keeps room for a peak still to come)."""
    if allocatable <= 0:
        return int(round(default_percent))
    rise = max(forecast_peak - current_usage, 0.0) / allocatable * 100.0
    return int(round(min(max(default_percent - rise, floor_percent), default_percent)))
