"""The API objects a fit's arrays become: one `ResourceRecommendation` per group and resource, the `vpa` policy laid
over ours where it sizes a group, the limit beside a target, and VPA's bounds around our request forecast."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from recommender.arrays import FloatArray, IntArray
from recommender.policy import RequestBounds, request_bounds, with_target
from recommender.resources import LineModels, Peak, ResourceRecommendation
from recommender.settings import PolicySettings


@dataclass(frozen=True)
class ResourceLines:
    """One resource's values for every group (parallel arrays, in the fitted groups' order) before they become API
    objects: VPA's target percentile (NaN: no histogram), our forecast lines (`ours`: see
    `WorkloadRecommender._forecast_lines`), the sized request and the lines drawn."""

    histogram_target: FloatArray
    enough: npt.NDArray[np.bool_]
    ours: dict[str, Any]
    ours_request: FloatArray
    has_line: npt.NDArray[np.bool_]
    sized: RequestBounds
    sized_target: FloatArray
    peak_bound: FloatArray
    lines: FloatArray
    long_values: FloatArray
    peak_values: FloatArray
    peak_times: IntArray
    stale: npt.NDArray[np.bool_]
    request_now: FloatArray
    limit_now: FloatArray

    def recommendations(self) -> list[ResourceRecommendation | None]:
        """Per group, its recommendation (None without a histogram or with too few samples), each value and model
        named after what drew it: our line where the forecast had one, the foundation's rule elsewhere."""
        result: list[ResourceRecommendation | None] = []
        ours = self.ours
        for i in range(len(self.enough)):
            if np.isnan(self.histogram_target[i]) or not self.enough[i]:
                result.append(None)
                continue
            drawn = {
                "target": self.ours_request[i],
                "short_term": 0.0 if self.has_line[i] else np.nan,
                "long_term": ours["long_term"][i],
            }
            names = ours["names"][i]
            stale = bool(self.stale[i])
            target = float(self.sized_target[i])
            limit, rule = recommended_limit(target, self.request_now[i], self.limit_now[i], float(self.peak_bound[i]))
            result.append(
                ResourceRecommendation(
                    target=target,
                    lower_bound=float(min(self.sized.lower_bound[i], target)),
                    upper_bound=float(max(self.sized.upper_bound[i], target)),
                    uncapped_target=float(self.sized.uncapped_target[i]),
                    short_term=self.lines[i].tolist(),
                    long_term=float(self.long_values[i]),
                    peak=Peak(value=float(self.peak_values[i]), at=int(self.peak_times[i])),
                    levels=ours["levels"][i],
                    stale=stale,
                    limit=limit,
                    limit_rule=rule,
                    limit_floor=float(self.peak_bound[i]) if np.isfinite(self.peak_bound[i]) else None,
                    models=LineModels(
                        target=names["target"] if not np.isnan(drawn["target"]) else "VPA histogram",
                        short_term="stale: the request held flat"
                        if stale
                        else names["short_term"]
                        if self.has_line[i]
                        else "SeasonalMaxReservation",
                        long_term=names["long_term"] if not np.isnan(drawn["long_term"]) else "Koordinator mid",
                        peak=names.get("peak", "max of the short-term line")
                        if not stale
                        else "max of the short-term line",
                        quality={line: q for line, q in ours["quality"][i].items() if not np.isnan(drawn[line])},
                    ),
                )
            )
        return result


def with_vpa(
    rec: ResourceRecommendation | None,
    vpa: FloatArray,
    row: int,
    allowed: tuple[float | None, float | None],
    request_now: float,
    limit_now: float,
) -> ResourceRecommendation | None:
    """A recommendation with its target and bounds from the `vpa` policy where it sizes this group (row of
    `WorkloadRecommender._vpa_bounds`): clamped to the allowed range like VPA's resource policy, the uncapped target
    before that; the memory cap and limit floor of the forecast policy do not apply. None where VPA has nothing."""
    if rec is None or np.isnan(vpa[row, 0]):
        return rec
    if vpa[row, 0] < 0:
        return None
    target, lower, upper = (float(v) for v in vpa[row])
    low = -np.inf if allowed[0] is None else allowed[0]
    high = np.inf if allowed[1] is None else allowed[1]
    capped = float(np.clip(target, low, high))
    limit, rule = recommended_limit(capped, request_now, limit_now, np.nan)
    models = (
        rec.models.model_copy(
            update={
                "target": "VPA recommender v1.5.1",
                "quality": {line: q for line, q in rec.models.quality.items() if line != "target"},
            }
        )
        if rec.models
        else None
    )
    return rec.model_copy(
        update={
            "target": capped,
            "lower_bound": float(np.clip(lower, low, high)),
            "upper_bound": float(np.clip(upper, low, high)),
            "uncapped_target": target,
            "policy": "vpa",
            "models": models,
            "limit_floor": None,
            "limit": limit,
            "limit_rule": rule,
        }
    )


def floats_or_none(values: FloatArray) -> list[float | None]:
    """A row as JSON-ready floats, None for NaN (`tolist` converts in C: 288 floats x 10,000 containers add up)."""
    return [None if v != v else v for v in values.tolist()]


def recommended_limit(
    target: float, request_now: float, limit_now: float, floor: float
) -> tuple[float | None, str | None]:
    """The limit we would set beside `target` and the rule that set it: scaled with the request as VPA does
    (limit x target / request), never below the target, and for memory never below `floor` (the observed peak plus a
    margin; NaN for CPU). None without a current limit (nothing to scale, and we never add one)."""
    if not np.isfinite(limit_now):
        return None, None
    scaled = limit_now * target / request_now if np.isfinite(request_now) and request_now > 0 else limit_now
    candidates = {"scaled with the request": scaled, "the request": target}
    if np.isfinite(floor):
        candidates["observed 7-day peak + margin"] = floor
    rule = max(candidates, key=lambda name: candidates[name])
    return float(candidates[rule]), rule


def sizer(
    confidence: FloatArray,
    per_pod: FloatArray,
    pod_minimum: float,
    min_allowed: float | None,
    max_allowed: float | None,
    policy: PolicySettings,
) -> Callable[[FloatArray, FloatArray, FloatArray, FloatArray], RequestBounds]:
    """VPA's bounds from histogram percentiles, with the target replaced by our request forecast where there is one."""

    def size(lower: FloatArray, target: FloatArray, upper: FloatArray, forecast: FloatArray) -> RequestBounds:
        vpa = request_bounds(lower, target, upper, confidence, per_pod, pod_minimum, min_allowed, max_allowed, policy)
        return with_target(vpa, forecast, pod_minimum / np.maximum(per_pod, 1.0), min_allowed, max_allowed)

    return size
