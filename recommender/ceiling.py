"""The usage ceiling: no line goes above what the container can use, unless evidence says it needs more.

Every line is a forecast of usage, and usage cannot pass the limit: memory is OOM-killed at it, CPU is throttled.
So without evidence that the container needs more than it got (an OOM kill, usage at the limit, CPU throttling), a
line (request and its upper bound, short-term with its live part, long-term, peak) stays at most
max(current limit, highest sample of the history window), the highest sample alone where there is no limit. A
fleet's calibration factor then cannot lift a steady container above anything it ever used. Where evidence lets a
line stand above the ceiling, that line's rule names the evidence; where the ceiling lowered it, the rule says so.

Every array holds one value (or one row of steps) per container, all in one unit: cores for CPU, bytes for memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from recommender.arrays import FloatArray

#: Per resource, the columns of tidy usage the ceiling reads besides the usage (memory is never throttled).
LIMIT_COLUMNS = {"cpu": "cpu_limit_cores", "memory": "memory_limit_bytes"}
THROTTLED_COLUMNS: dict[str, str | None] = {"cpu": "cpu_throttled_fraction", "memory": None}
#: The rule of a line the ceiling lowered.
CAPPED = "capped at max(limit, highest sample)"
#: Prefix of the rule of a line evidence lets stand above the ceiling; the evidence follows.
ABOVE = "above max(limit, highest sample): "


def usage_ceiling(limit: npt.ArrayLike, highest_usage: npt.ArrayLike) -> FloatArray:
    """max(limit, highest usage) per container. A limit that is NaN or not positive is none (a limit of 0 is an
    unset one), so the highest usage alone bounds; NaN where neither is known (nothing bounds the lines)."""
    limits = np.asarray(limit, dtype=np.float64)
    highest = np.asarray(highest_usage, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        set_limits = np.where(limits > 0, limits, np.nan)
    result: FloatArray = np.fmax(set_limits, np.where(np.isfinite(highest), highest, np.nan))
    return result


def ceiling_evidence(
    limit: npt.ArrayLike,
    highest_usage: npt.ArrayLike,
    oom_kills: npt.ArrayLike,
    throttled_fraction: npt.ArrayLike,
    near_limit_fraction: float,
    throttled_threshold: float,
) -> list[str | None]:
    """Per container, why it may need more than its ceiling ("; "-joined), or None without evidence: OOM kills
    (any), the highest usage at `near_limit_fraction` of a set limit or more, or CPU throttled in more than
    `throttled_threshold` of its CFS periods (NaN: unknown, no evidence). Pass zeros and NaN where a resource has
    no such signal (CPU has no OOM kills, memory no throttling)."""
    limits = np.asarray(limit, dtype=np.float64)
    highest = np.asarray(highest_usage, dtype=np.float64)
    kills = np.asarray(oom_kills, dtype=np.float64)
    throttled = np.asarray(throttled_fraction, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(limits > 0, highest / limits, np.nan)
    out: list[str | None] = []
    for k, s, t in zip(kills.tolist(), share.tolist(), throttled.tolist()):
        found = []
        if k > 0:
            found.append(f"{int(k)} OOM kill{'s' if k > 1 else ''} in the history")
        if s == s and s >= near_limit_fraction:
            found.append(f"usage reached {100 * s:.0f} % of the limit")
        if t == t and t > throttled_threshold:
            found.append(f"throttled in {100 * t:.0f} % of CFS periods")
        out.append("; ".join(found) if found else None)
    return out


def within_ceiling(values: FloatArray, ceiling: FloatArray, evidence: Sequence[str | None]) -> FloatArray:
    """`values` (one per container, or a row of steps each) at most their container's ceiling, except where there
    is evidence or no ceiling (NaN); NaN values stay NaN."""
    lifted = np.array([reason is not None for reason in evidence], dtype=bool).reshape(-1)
    bound = np.where(lifted | np.isnan(ceiling), np.inf, ceiling)
    result: FloatArray = np.minimum(values, bound.reshape(bound.shape + (1,) * (np.ndim(values) - 1)))
    return result


def ceiling_rules(
    lines: Mapping[str, FloatArray], ceilings: Mapping[str, FloatArray], evidence: Sequence[str | None]
) -> list[dict[str, str]]:
    """Per container, the rule of each line (by name) that rises above its ceiling before `within_ceiling`: the
    evidence that lets it stand there, or `CAPPED`. Lines at or below their ceiling have none."""
    rules: list[dict[str, str]] = [{} for _ in evidence]
    for name, values in lines.items():
        top = np.asarray(values, dtype=np.float64)
        if top.ndim > 1:
            with np.errstate(all="ignore"):
                top = np.where(np.isnan(top), -np.inf, top).max(axis=tuple(range(1, top.ndim)))
        with np.errstate(invalid="ignore"):
            above = np.flatnonzero(top > ceilings[name])
        for i in above.tolist():
            reason = evidence[i]
            rules[i][name] = CAPPED if reason is None else ABOVE + reason
    return rules


def ceilings_at(
    usage: FloatArray,
    limit: FloatArray,
    throttled_fraction: FloatArray,
    positions: Sequence[int],
    window_steps: int,
    near_limit_fraction: float,
    throttled_threshold: float,
) -> tuple[FloatArray, list[list[str | None]]]:
    """Decisions made on (rows x steps) grids at the columns `positions`, each seeing only the columns before it:
    per decision and row, the ceiling of the newest limit and the highest usage of the last `window_steps`, and the
    evidence of those and the newest throttled share. A usage file carries no OOM kills: the backtest and the replay
    of `recommend`'s and the live loop's lines on a file."""
    ceilings, evidence = [], []
    for position in positions:
        window = usage[:, max(position - window_steps, 0) : position]
        with np.errstate(all="ignore"):
            highest = np.where(np.isnan(window), -np.inf, window).max(axis=1, initial=-np.inf)
        newest_limit = _newest(limit, position)
        ceilings.append(usage_ceiling(newest_limit, highest))
        evidence.append(
            ceiling_evidence(
                newest_limit,
                highest,
                np.zeros(len(usage)),
                _newest(throttled_fraction, position),
                near_limit_fraction,
                throttled_threshold,
            )
        )
    return np.stack(ceilings) if ceilings else np.zeros((0, len(usage))), evidence


def _newest(grid: FloatArray, end: int) -> FloatArray:
    """Per row, the newest finite value of `grid` before column `end`; NaN where none."""
    past = grid[:, : max(end, 0)]
    if past.shape[1] == 0:
        return np.full(len(grid), np.nan)
    last = np.where(np.isfinite(past), np.arange(past.shape[1]), -1).max(axis=1)
    result: FloatArray = np.where(last >= 0, past[np.arange(len(grid)), np.maximum(last, 0)], np.nan)
    return result
