"""The API objects a fit's arrays become: one `ResourceRecommendation` per group and resource, the `vpa` policy laid
over ours where it sizes a group, the limit beside a target (`recommender.limits`), and VPA's bounds around our request forecast."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from recommender.arrays import FloatArray
from recommender.limits import Resource, recommended_limit
from recommender.policy import RequestBounds, request_bounds, with_target
from recommender.resources import LineModels, LiveLine, Peak, ResourceRecommendation
from recommender.settings import PolicySettings
from recommender.trusted import constructor

#: The objects `recommendations` builds for every container and resource (`constructor`).
_BUILD_RESOURCE = constructor(ResourceRecommendation)
_BUILD_LIVE = constructor(LiveLine)
_BUILD_PEAK = constructor(Peak)
_BUILD_MODELS = constructor(LineModels)


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
    peak_times: FloatArray
    stale: npt.NDArray[np.bool_]
    request_now: FloatArray
    limit_now: FloatArray
    resource: Resource
    #: The learned live line per group (NaN where it does not serve), its factor and block, and its model's name.
    live: FloatArray | None = None
    live_factor: FloatArray | None = None
    live_block: tuple[int, int] = (0, 0)
    live_model: str = ""
    #: Per group, the usage ceiling (`recommender.ceiling`; NaN: none) and the rules of the lines it touched.
    ceiling: FloatArray | None = None
    ceiling_rules: list[dict[str, str]] | None = None

    def recommendations(self) -> list[ResourceRecommendation | None]:
        """Per group, its recommendation (None without a histogram or with too few samples), each value and model
        named after what drew it: our line where the forecast had one, the foundation's rule elsewhere.

        Built as `model_construct` builds them (`recommender.trusted.constructor`), not validated: every value is
        already of its field's type (Python floats, ints, bools, strings and the nested models), and validating ~17
        objects per container was most of a live pass's `predict` at fleet size. `tests/unit/test_live_cost.py`
        checks that validation gives the same."""
        result: list[ResourceRecommendation | None] = []
        ours = self.ours
        missing = (np.isnan(self.histogram_target) | ~self.enough).tolist()
        no_request, no_long_term = np.isnan(self.ours_request).tolist(), np.isnan(ours["long_term"]).tolist()
        columns = (
            self.sized_target, self.sized.lower_bound, self.sized.upper_bound, self.sized.uncapped_target,
            self.long_values, self.peak_values, self.peak_times, self.peak_bound, self.request_now, self.limit_now,
        )  # fmt: skip
        rows = zip(*(column.tolist() for column in columns), self.stale.tolist(), self.has_line.tolist())
        live = self.live.tolist() if self.live is not None else [float("nan")] * len(self.stale)
        live_factor = self.live_factor.tolist() if self.live_factor is not None else live
        ceiling = floats_or_none(self.ceiling) if self.ceiling is not None else [None] * len(self.stale)
        ceiling_rules = self.ceiling_rules if self.ceiling_rules is not None else [{} for _ in self.stale]
        for i, (
            target,
            lower,
            upper,
            uncapped,
            long_value,
            peak,
            peak_at,
            floor,
            request,
            limit_now,
            stale,
            line,
        ) in enumerate(rows):
            if missing[i]:
                result.append(None)
                continue
            names = ours["names"][i]
            limit, rule = recommended_limit(self.resource, target, request, limit_now, floor)
            drawn = {"target": not no_request[i], "short_term": line, "long_term": not no_long_term[i]}
            result.append(
                _BUILD_RESOURCE(
                    target=target,
                    lower_bound=min(lower, target),
                    upper_bound=max(upper, target),
                    uncapped_target=uncapped,
                    short_term=self.lines[i].tolist(),
                    live_short_term=None
                    if live[i] != live[i]
                    else _BUILD_LIVE(
                        value=live[i],
                        issued_at=self.live_block[0],
                        until=self.live_block[1],
                        calibration_factor=live_factor[i],
                        model=self.live_model,
                    ),
                    long_term=long_value,
                    peak=_BUILD_PEAK(value=peak, at=None if peak_at != peak_at else int(peak_at)),
                    levels=ours["levels"][i],
                    stale=stale,
                    limit=limit,
                    limit_rule=rule,
                    limit_floor=floor if np.isfinite(floor) else None,
                    ceiling=ceiling[i],
                    ceiling_rules=ceiling_rules[i],
                    models=_BUILD_MODELS(
                        target=names["target"] if drawn["target"] else "VPA histogram",
                        short_term=stale_line_name(request, limit_now)
                        if stale
                        else names["short_term"]
                        if line
                        else "SeasonalMaxReservation",
                        long_term=stale_line_name(request, limit_now)
                        if stale
                        else names["long_term"]
                        if drawn["long_term"]
                        else "Koordinator mid",
                        peak=names.get("peak", "max of the short-term line")
                        if not stale
                        else "max of the short-term line",
                        quality={name: q for name, q in ours["quality"][i].items() if drawn[name]},
                    ),
                )
            )
        return result


def with_vpa(
    resource: Resource,
    rec: ResourceRecommendation | None,
    vpa: FloatArray,
    row: int,
    allowed: tuple[float | None, float | None],
    request_now: float,
    limit_now: float,
) -> ResourceRecommendation | None:
    """A recommendation with its target and bounds from the `vpa` policy where it sizes this group (row of
    `WorkloadRecommender._vpa_bounds`): clamped to the allowed range like VPA's resource policy, the uncapped target
    before that; the memory cap and usage ceiling of the forecast policy do not apply, its limit floor does (a
    limit is ours to set, and one under a peak the container reached is an OOM kill). None where VPA has nothing."""
    if rec is None or np.isnan(vpa[row, 0]):
        return rec
    if vpa[row, 0] < 0:
        return None
    target, lower, upper = (float(v) for v in vpa[row])
    low = -np.inf if allowed[0] is None else allowed[0]
    high = np.inf if allowed[1] is None else allowed[1]
    capped = float(np.clip(target, low, high))
    limit, rule = recommended_limit(resource, capped, request_now, limit_now, rec.limit_floor)
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
            "limit": limit,
            "limit_rule": rule,
            # VPA's numbers are its own: the ceiling holds only our lines.
            "ceiling_rules": {k: v for k, v in rec.ceiling_rules.items() if k not in _VPA_LINES},
        }
    )


#: The values `with_vpa` takes from VPA.
_VPA_LINES = ("target", "uncapped_target", "upper_bound")


def stale_hold(request_now: FloatArray, limit_now: FloatArray, target: FloatArray) -> FloatArray:
    """What a stale container's lines hold flat, per group: its current request (the limit where only a limit is
    set, as Kubernetes defaults the request), else the recommended target. Without fresh samples nothing says it
    needs less than it asked for, so no batch pod is offered its room (`stale_line_name` says which)."""
    asked = np.where(np.isfinite(request_now) & (request_now > 0), request_now, limit_now)
    held: FloatArray = np.where(np.isfinite(asked) & (asked > 0), asked, target)
    return held


def stale_line_name(request_now: float, limit_now: float) -> str:
    """The name of a stale container's lines: what `stale_hold` held flat."""
    if np.isfinite(request_now) and request_now > 0:
        return "stale: the current request held flat"
    if np.isfinite(limit_now) and limit_now > 0:
        return "stale: the current request (its limit) held flat"
    return "stale: the recommended request held flat (no current request)"


def floats_or_none(values: FloatArray) -> list[float | None]:
    """A row as JSON-ready floats, None for NaN (`tolist` converts in C: 288 floats x 10,000 containers add up)."""
    return [None if v != v else v for v in values.tolist()]


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
