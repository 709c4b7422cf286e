"""What the admission webhook does to a pod, as a pure function of the pod, the recommendations and the settings.

Whether to size at all is the opt-in's (`recommender.optin`); the webhook rules and a VPA's container policies say
how. Sizing follows VPA's admission controller (anchors.md section 2): requests <- the chosen line, limits scaled by
the same factor (newLimit = oldLimit x newRequest / oldRequest, `recommender.limits`: the limit every surface
states), containers without a recommendation untouched. On top,
ClusterColocationProfile-like rules set Koordinator's QoS and priority and rename cpu/memory to batch-*/mid-* for
batch and mid pods. The result is checked against Koordinator's validating rules; a change that would make the pod
invalid is dropped (colocation first, then sizing) with a warning, so the webhook never causes a rejection.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from recommender import koordinator
from recommender.identity import WorkloadKey
from recommender.limits import on_grid, recommended_limit
from recommender.optin import OptIn
from recommender.owners import workload_candidates
from recommender.resources import ResourceRecommendation, WorkloadRecommendation
from recommender.settings import ColocationProfile, MutationSettings, WebhookPolicy
from recommender.units import cpu_cores_from_quantity, cpu_quantity, memory_bytes_from_quantity, memory_quantity

#: The audit record on every pod we change: version, mode, source of the opt-in, what changed.
APPLIED_ANNOTATION = "koord-recommender.io/applied"
#: The same record in dry-run (webhook.dry_run), the only thing then written.
WOULD_APPLY_ANNOTATION = "koord-recommender.io/would-apply"

Lookup = Callable[[WorkloadKey], WorkloadRecommendation | None]


@dataclass
class Mutation:
    """The pod as it should be created, what changed (for the annotation and logs) and why anything was skipped."""

    pod: dict[str, Any]
    workload: str | None = None
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: resources left alone because a HorizontalPodAutoscaler scales the workload on them
    hpa_refused: list[str] = field(default_factory=list)
    #: learned usage (long-term line, capped at the limit) summed over the sized containers
    usage_cores: float = 0.0
    usage_bytes: float = 0.0


_PARSE = {"cpu": cpu_cores_from_quantity, "memory": memory_bytes_from_quantity}
_FORMAT = {"cpu": cpu_quantity, "memory": memory_quantity}


_METADATA_FIELDS = ("name", "generateName", "labels", "annotations", "ownerReferences")
_SPEC_FIELDS = ("priority", "priorityClassName")
_CONTAINER_FIELDS = ("name", "resources", "restartPolicy")


def relevant_fields(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a pod `mutate` reads or writes, at the same paths (list positions kept).

    Diffing the projections of the pod before and after gives the same JSON Patch as diffing the whole pods, at a
    fraction of the cost: env, probes, volumes and the like are neither copied nor compared.
    """
    metadata, spec = pod.get("metadata"), pod.get("spec")
    view: dict[str, Any] = {}
    if isinstance(metadata, Mapping):
        view["metadata"] = {k: metadata[k] for k in _METADATA_FIELDS if k in metadata}
    if isinstance(spec, Mapping):
        view["spec"] = {k: spec[k] for k in _SPEC_FIELDS if k in spec}
        for field in ("initContainers", "containers"):
            if isinstance(spec.get(field), list):
                view["spec"][field] = [
                    {k: c[k] for k in _CONTAINER_FIELDS if k in c} if isinstance(c, Mapping) else c for c in spec[field]
                ]
    return view


def _line_value(resource: ResourceRecommendation, line: str) -> float:
    return resource.peak.value if line == "peak" else float(getattr(resource, line))


def _clamp(value: float, low: float | None, high: float | None) -> float:
    if low is not None:
        value = max(value, low)
    if high is not None:
        value = min(value, high)
    return value


def policy_for(settings: MutationSettings, namespace: str, workload: str) -> WebhookPolicy:
    """The first rule matching the namespace and workload, else the default rule."""
    for policy in settings.policies:
        if fnmatch.fnmatchcase(namespace, policy.namespace) and fnmatch.fnmatchcase(workload, policy.workload):
            return policy
    return WebhookPolicy()


def resolve_workload(pod: Mapping[str, Any], namespace: str, lookup: Lookup) -> str | None:
    """The first candidate workload name of which some container of the pod has a recommendation."""
    names = [str(c.get("name")) for _, _, c in koordinator.all_containers(pod)]
    for candidate in workload_candidates(pod):
        if any(lookup(WorkloadKey(namespace, candidate, name)) is not None for name in names):
            return candidate
    return None


def container_policy(policy: WebhookPolicy, optin: OptIn, container: str) -> WebhookPolicy | None:
    """The rule for one container: the webhook rule, narrowed by the VPA's container policy (None: its mode is Off)."""
    vpa = optin.container_policy(container)
    update: dict[str, Any] = {}
    if vpa is not None:
        if vpa.mode == "Off":
            return None
        if vpa.controlled_resources is not None:
            update["controlled_resources"] = list(vpa.controlled_resources)
        if vpa.controlled_values is not None:
            update["controlled_values"] = vpa.controlled_values
        for name, unit in (("cpu", "cpu_cores"), ("memory", "memory_bytes")):
            if name in vpa.min_allowed:
                update[f"min_{unit}"] = vpa.min_allowed[name]
            if name in vpa.max_allowed:
                update[f"max_{unit}"] = vpa.max_allowed[name]
    return policy.model_copy(update=update) if update else policy


def _size_container(
    container: dict[str, Any], rec: WorkloadRecommendation, policy: WebhookPolicy, hpa: frozenset[str], result: Mutation
) -> None:
    """Set one container's requests (and limits) from its recommendation, as VPA's admission controller does."""
    resources = container.setdefault("resources", {})
    requests = dict(resources.get("requests") or {})
    limits = dict(resources.get("limits") or {})
    bounds = {
        "cpu": (policy.min_cpu_cores, policy.max_cpu_cores),
        "memory": (policy.min_memory_bytes, policy.max_memory_bytes),
    }
    for name in policy.controlled_resources:
        learned: ResourceRecommendation | None = getattr(rec, name)
        if learned is None:
            continue
        if name in hpa:
            if name not in result.hpa_refused:
                result.hpa_refused.append(name)
            continue
        if learned.stale:
            result.warnings.append(
                f"koord-recommender: {container.get('name')}: {name} not resized, the recommendation is stale (no recent samples)"
            )
            continue
        parse, fmt = _PARSE[name], _FORMAT[name]
        new_request = on_grid(name, _clamp(_line_value(learned, policy.line), *bounds[name]))
        old_limit = parse(limits[name]) if name in limits else None
        old_request = parse(requests[name]) if name in requests else None
        scale_limit = policy.controlled_values == "RequestsAndLimits" and bool(old_limit)
        if old_limit is not None and not scale_limit:
            new_request = min(new_request, old_limit)  # a request above an unchanged limit would be rejected
        request_text = fmt(new_request)
        if old_limit is not None and not scale_limit and parse(request_text) > old_limit:
            # Rounded up to the quantity grid (whole millicores, MiB), a request at a limit off that grid (1.5m,
            # 10^9 bytes) would pass it and the API server would reject the pod: the limit is the largest it accepts.
            request_text = limits[name]
        if requests.get(name) != request_text:
            result.changes.append(
                f"{container.get('name')}: {name} request {requests.get(name, '-')} -> {request_text}"
            )
            requests[name] = request_text
        # The limit the recommendation's `limit` states for this request: one computation for every surface.
        new_limit, _ = recommended_limit(name, new_request, old_request, old_limit, learned.limit_floor)
        if scale_limit and new_limit is not None:
            limit_text = fmt(new_limit)
            if limits[name] != limit_text:
                result.changes.append(f"{container.get('name')}: {name} limit {limits[name]} -> {limit_text}")
                limits[name] = limit_text
        ceiling = parse(limits[name]) if name in limits else parse(request_text)
        usage = min(learned.long_term, ceiling)
        if name == "cpu":
            result.usage_cores += usage
        else:
            result.usage_bytes += usage
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits


def _matches(profile: ColocationProfile, namespace: str, labels: Mapping[str, Any]) -> bool:
    return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in profile.namespaces) and all(
        labels.get(k) == v for k, v in profile.selector.items()
    )


def _colocate(pod: dict[str, Any], namespace: str, settings: MutationSettings, result: Mutation) -> None:
    """Apply matching colocation profiles in name order, then rename resources for batch/mid pods."""
    metadata = pod.setdefault("metadata", {})
    for profile in sorted(settings.colocation_profiles, key=lambda p: p.name):
        if not _matches(profile, namespace, metadata.get("labels") or {}):
            continue
        labels = dict(profile.labels)
        if profile.qos_class is not None:
            labels[koordinator.QOS_LABEL] = profile.qos_class
        if profile.koordinator_priority is not None:
            labels[koordinator.SUB_PRIORITY_LABEL] = str(profile.koordinator_priority)
        if labels:
            metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
        if profile.annotations:
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **profile.annotations}
        if profile.priority_class_name is not None:
            value = settings.priority_class_values.get(profile.priority_class_name)
            if value is None:
                result.warnings.append(f"profile {profile.name}: unknown priority class {profile.priority_class_name}")
            else:
                pod.setdefault("spec", {}).update(priorityClassName=profile.priority_class_name, priority=value)
        result.changes.append(f"colocation profile {profile.name}")
    priority = koordinator.priority_class(pod)
    if priority in koordinator.EXTENDED_PREFIX:
        for _, _, container in koordinator.all_containers(pod):
            if "resources" in container:
                container["resources"] = koordinator.extended_resources(container["resources"], priority)  # type: ignore[index]
        result.changes.append(f"resources renamed to {koordinator.EXTENDED_PREFIX[priority]}* for {priority}")


def _scaling_factors(result: Mutation, pod: Mapping[str, Any]) -> dict[str, int]:
    """Learned usage as a percentage of max(request, limit) of the sized containers (Koordinator's estimator base)."""
    totals = {"cpu": 0.0, "memory": 0.0}
    for _, _, container in koordinator.all_containers(pod):
        resources = container.get("resources") or {}
        for name in totals:
            values = [
                _PARSE[name](part[name])
                for part in (resources.get("requests") or {}, resources.get("limits") or {})
                if name in part
            ]
            totals[name] += max(values, default=0.0)
    factors = {}
    for name, usage in (("cpu", result.usage_cores), ("memory", result.usage_bytes)):
        if usage > 0 and totals[name] > 0:
            factors[name] = min(100, max(1, math.ceil(100 * usage / totals[name])))
    return factors


def mutate(
    pod: Mapping[str, Any], namespace: str, lookup: Lookup, settings: MutationSettings, version: str, optin: OptIn
) -> Mutation:
    """The mutated pod (in dry-run: the pod with only the would-apply record). Never raises on odd pods it
    understands; callers fail open on anything else."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if APPLIED_ANNOTATION in annotations or WOULD_APPLY_ANNOTATION in annotations:
        # already ours (a reinvocation): changing it again would not be idempotent for batch pods
        return Mutation(pod=copy.deepcopy(dict(pod)))
    result = _mutate(pod, namespace, lookup, settings, version, optin, colocate=True)
    result.warnings[:0] = optin.warnings
    if result.hpa_refused:
        names = " and ".join(result.hpa_refused)
        result.warnings.append(
            f"koord-recommender: a HorizontalPodAutoscaler scales {result.workload} on {names}; {names} left unchanged"
        )
    if not result.changes:
        return result
    record = {
        "version": version,
        "mode": optin.mode,
        "source": optin.source,
        "workload": result.workload,
        "line": policy_for(settings, namespace, result.workload or "").line,
        "changes": result.changes,
    }
    if settings.dry_run:
        result.pod = copy.deepcopy(dict(pod))
        key = WOULD_APPLY_ANNOTATION
    else:
        key = APPLIED_ANNOTATION
    metadata = result.pod.setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), key: json.dumps(record)}
    return result


def _mutate(
    pod: Mapping[str, Any],
    namespace: str,
    lookup: Lookup,
    settings: MutationSettings,
    version: str,
    optin: OptIn,
    *,
    colocate: bool,
) -> Mutation:
    mutated: dict[str, Any] = copy.deepcopy(dict(pod))
    result = Mutation(pod=mutated)
    result.workload = resolve_workload(pod, namespace, lookup)
    if result.workload is None:
        result.warnings.append(
            f"koord-recommender: no recommendation for workload {workload_candidates(pod)[:1]} in {namespace}"
        )
        return result
    policy = policy_for(settings, namespace, result.workload)
    if optin.sizes:
        for _, _, container in koordinator.all_containers(mutated):
            name = str(container.get("name"))
            rec = lookup(WorkloadKey(namespace, result.workload, name))
            rule = container_policy(policy, optin, name)
            if rec is not None and rule is not None:
                _size_container(container, rec, rule, optin.hpa_resources, result)  # type: ignore[arg-type]
    metadata = mutated.setdefault("metadata", {})
    factors = _scaling_factors(result, mutated) if settings.scaling_factors else {}
    if factors:
        text = json.dumps(factors)
        if (metadata.get("annotations") or {}).get(koordinator.SCALING_FACTORS_ANNOTATION) != text:
            result.changes.append(f"{koordinator.SCALING_FACTORS_ANNOTATION} {text}")
        metadata["annotations"] = {**(metadata.get("annotations") or {}), koordinator.SCALING_FACTORS_ANNOTATION: text}
    if colocate:
        _colocate(mutated, namespace, settings, result)
    new_problems = set(koordinator.violations(mutated)) - set(koordinator.violations(pod))
    if new_problems:
        if colocate and settings.colocation_profiles:
            retry = _mutate(pod, namespace, lookup, settings, version, optin, colocate=False)
            retry.warnings.insert(
                0, f"koord-recommender: colocation skipped, Koordinator would reject: {sorted(new_problems)[0]}"
            )
            return retry
        rejected = Mutation(pod=copy.deepcopy(dict(pod)), workload=result.workload)
        rejected.warnings.append(f"koord-recommender: not resized, Koordinator would reject: {sorted(new_problems)[0]}")
        return rejected
    return result
