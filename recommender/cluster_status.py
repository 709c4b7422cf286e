"""Status objects we write into the cluster, built from a workload's recommendation (pure functions).

- VerticalPodAutoscaler (autoscaling.k8s.io/v1) status, as VPA's own recommender writes it: per container
  target / lowerBound / upperBound / uncappedTarget, after the VPA's resource policy (mode Off, controlled resources,
  minAllowed / maxAllowed), with the RecommendationProvided and LowConfidence conditions, and, while the live loop's
  updates are served, RecommendationStale (True once the served update is older than it should be: the loop stalled).
- Koordinator Recommendation (analysis.koordinator.sh/v1alpha1) status: per container recommended resources,
  updateTime and conditions.
Conditions keep their lastTransitionTime while their status does not change, so an unchanged recommendation
produces an identical status and no write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from recommender.resources import ResourceRecommendation, WorkloadRecommendation
from recommender.units import (
    cpu_cores_from_quantity,
    cpu_quantity,
    memory_bytes_from_quantity,
    memory_quantity,
    vpa_cpu_quantity,
    vpa_memory_quantity,
)

#: Below this much history VPA's confidence is low; we say so in the LowConfidence condition.
LOW_CONFIDENCE_DAYS = 1.0
BOUNDS = (
    ("target", "target"),
    ("lowerBound", "lower_bound"),
    ("upperBound", "upper_bound"),
    ("uncappedTarget", "uncapped_target"),
)


def _now() -> str:
    return _rfc3339(datetime.now(UTC).timestamp())


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LiveFreshness:
    """The live update served: its revision, when it was written (Unix seconds) and whether that is longer ago than
    the sync's `live_stale_after_seconds` (decided by the caller, who has the clock)."""

    revision: str
    written_at: float
    stale_after_seconds: float
    stale: bool


def _stale_condition(live: LiveFreshness, previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """VPA's conditions are negative where they warn (LowConfidence): this one is True while the lines age. Its
    message names the update's write time, not its age, so an ageing status is written once, not every pass."""
    written = _rfc3339(live.written_at)
    if live.stale:
        reason = "LiveUpdateAgeing"
        message = (
            f"live update {live.revision} was written at {written}, over {live.stale_after_seconds:.0f} s ago: the "
            "live loop has stopped publishing (see its koord_recommender_live_errors); these are its last lines"
        )
    else:
        reason, message = "LiveUpdateFresh", f"live update {live.revision} written at {written}"
    return _condition("RecommendationStale", live.stale, reason, message, previous)


def _condition(
    kind: str, status: bool, reason: str, message: str, previous: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    state = "True" if status else "False"
    old = next((c for c in previous if c.get("type") == kind), None)
    since = (
        old["lastTransitionTime"] if old and old.get("status") == state and old.get("lastTransitionTime") else _now()
    )
    return {"type": kind, "status": state, "reason": reason, "message": message, "lastTransitionTime": since}


def _policy_for(container: str, vpa_spec: Mapping[str, Any]) -> Mapping[str, Any]:
    policies = (vpa_spec.get("resourcePolicy") or {}).get("containerPolicies") or []
    named = next((p for p in policies if p.get("containerName") == container), None)
    return named or next((p for p in policies if p.get("containerName") == "*"), None) or {}


def _quantity(resource: str, value: float, policy: str = "forecast") -> str:
    """A value as a quantity: the `vpa` policy's as VPA writes them (truncated, exact bytes), ours rounded up."""
    if policy == "vpa":
        return vpa_cpu_quantity(value) if resource == "cpu" else vpa_memory_quantity(value)
    return cpu_quantity(value) if resource == "cpu" else memory_quantity(value)


def _parse(resource: str, quantity: str | int | float) -> float:
    return cpu_cores_from_quantity(quantity) if resource == "cpu" else memory_bytes_from_quantity(quantity)


def vpa_container_recommendation(rec: WorkloadRecommendation, policy: Mapping[str, Any]) -> dict[str, Any] | None:
    """One containerRecommendations entry, or None when the policy turns the container off or nothing is known."""
    if policy.get("mode") == "Off":
        return None
    controlled = policy.get("controlledResources") or ["cpu", "memory"]
    low = policy.get("minAllowed") or {}
    high = policy.get("maxAllowed") or {}
    entry: dict[str, Any] = {"containerName": rec.container}
    for field, _ in BOUNDS:
        entry[field] = {}
    for resource in ("cpu", "memory"):
        found: ResourceRecommendation | None = getattr(rec, resource)
        if found is None or resource not in controlled:
            continue
        for field, attribute in BOUNDS:
            value = getattr(found, attribute)
            if field != "uncappedTarget":
                if resource in low:
                    value = max(value, _parse(resource, low[resource]))
                if resource in high:
                    value = min(value, _parse(resource, high[resource]))
            entry[field][resource] = _quantity(resource, value, found.policy)
    return entry if entry["target"] else None


def vpa_status(
    recommendations: Sequence[WorkloadRecommendation],
    vpa: Mapping[str, Any],
    version: str,
    live: LiveFreshness | None = None,
) -> dict[str, Any]:
    """The whole VPA status for the workload its targetRef names (recommendations already filtered to it); `live`:
    the live update served, if any (the RecommendationStale condition)."""
    spec = vpa.get("spec") or {}
    previous = (vpa.get("status") or {}).get("conditions") or []
    containers = [c for r in recommendations if (c := vpa_container_recommendation(r, _policy_for(r.container, spec)))]
    target = spec.get("targetRef") or {}
    name = f"{target.get('kind', '?')}/{target.get('name', '?')}"
    conditions = [
        _condition(
            "RecommendationProvided",
            bool(containers),
            "Recommended" if containers else "NoRecommendation",
            f"koord-recommender model version {version}" if containers else f"no usage history learned for {name}",
            previous,
        )
    ]
    if containers:
        days = min(
            ((r.history.last_sample - r.history.first_sample) / 86400 if r.history else 0.0) for r in recommendations
        )
        conditions.append(
            _condition(
                "LowConfidence",
                days < LOW_CONFIDENCE_DAYS,
                "ShortHistory" if days < LOW_CONFIDENCE_DAYS else "EnoughHistory",
                f"{days:.1f} days of usage history",
                previous,
            )
        )
    if containers and live is not None:
        conditions.append(_stale_condition(live, previous))
    status: dict[str, Any] = {"conditions": conditions}
    if containers:
        status["recommendation"] = {"containerRecommendations": containers}
    return status


def koordinator_status(
    recommendations: Sequence[WorkloadRecommendation], recommendation_object: Mapping[str, Any], version: str
) -> dict[str, Any]:
    """The status of a Koordinator Recommendation whose target is a workload (recommendations filtered to it)."""
    old = recommendation_object.get("status") or {}
    previous = old.get("conditions") or []
    generation = (recommendation_object.get("metadata") or {}).get("generation", 0)
    spec_target = (recommendation_object.get("spec") or {}).get("target") or {}
    containers = []
    for rec in recommendations:
        resources = {
            resource: _quantity(resource, found.target, found.policy)
            for resource in ("cpu", "memory")
            if (found := getattr(rec, resource)) is not None
        }
        if resources:
            containers.append({"containerName": rec.container, "resources": resources})
    if spec_target.get("type") != "workload":
        reason, message, ok = "UnsupportedTarget", "only workload targets are supported; podSelector is not", False
    elif not containers:
        workload = spec_target.get("workload") or {}
        reason, message, ok = (
            "NoRecommendation",
            f"no usage history learned for {workload.get('kind')}/{workload.get('name')}",
            False,
        )
    else:
        reason, message, ok = "Recommended", f"koord-recommender model version {version}", True
    condition = _condition("RecommendationReady", ok, reason, message, previous) | {"observedGeneration": generation}
    status: dict[str, Any] = {"conditions": [condition]}
    if containers:
        status["podStatus"] = {"containerStatuses": containers}
    unchanged = {k: v for k, v in old.items() if k != "updateTime"} == status
    status["updateTime"] = old.get("updateTime") if unchanged and old.get("updateTime") else _now()
    return status


def same_status(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change nothing (so no write is made)."""
    return dict(old or {}) == dict(new)
