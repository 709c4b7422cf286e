"""Koordinator's pod conventions as pure functions (anchors.md section 1), so every layer can reuse them.

Priority classes come from the `koordinator.sh/priority-class` label or `spec.priority` ranges, QoS classes from the
`koordinator.sh/qosClass` label or the Kubernetes QoS class; `violations` mirrors the rules of Koordinator's
validating webhook so that we never send a pod it would reject; `extended_resources` renames cpu/memory to the
batch-*/mid-* resources the way a ClusterColocationProfile does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from recommender.units import cpu_cores_from_quantity, cpu_millicores, memory_bytes_from_quantity

PRIORITY_CLASS_LABEL = "koordinator.sh/priority-class"
QOS_LABEL = "koordinator.sh/qosClass"
SUB_PRIORITY_LABEL = "koordinator.sh/priority"
USAGE_THRESHOLDS_ANNOTATION = "scheduling.koordinator.sh/usage-thresholds"
#: Written by `recommender sync --usage-thresholds` beside USAGE_THRESHOLDS_ANNOTATION: JSON {"written": {cpu, memory},
#: "operator": {cpu, memory}}, what we wrote there and the operator's values it replaced (see `operator_thresholds`).
WRITTEN_THRESHOLDS_ANNOTATION = "koord-recommender.io/usage-thresholds-written"
SCALING_FACTORS_ANNOTATION = "scheduling.koordinator.sh/load-estimated-scaling-factors"

PROD, MID, BATCH, FREE, NONE = "koord-prod", "koord-mid", "koord-batch", "koord-free", "none"
#: spec.priority ranges of Koordinator's priority classes, inclusive.
PRIORITY_RANGES: dict[str, tuple[int, int]] = {
    PROD: (9000, 9999),
    MID: (7000, 7999),
    BATCH: (5000, 5999),
    FREE: (3000, 3999),
}
QOS_CLASSES = ("SYSTEM", "LSE", "LSR", "LS", "BE")
#: Priority classes that borrow reclaimed room instead of reserving their own (Koordinator's HPUsed leaves them out).
BORROWING_CLASSES = (BATCH, FREE)
#: The extended-resource prefix each priority class's pods are accounted in; other classes keep cpu/memory.
EXTENDED_PREFIX = {BATCH: "kubernetes.io/batch-", MID: "kubernetes.io/mid-"}

Pod = Mapping[str, Any]


def all_containers(pod: Pod) -> Iterable[tuple[str, int, Mapping[str, Any]]]:
    """(list name, index, container) for regular and init containers (sidecars are init containers)."""
    spec = pod.get("spec") or {}
    for field in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field) or []):
            yield field, index, container


def kubernetes_qos(pod: Pod) -> str:
    """The Kubernetes QoS class: Guaranteed, Burstable or BestEffort (from cpu/memory requests and limits)."""
    containers = [c for _, _, c in all_containers(pod)]
    any_set = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in ("cpu", "memory"):
            if name in requests or name in limits:
                any_set = True
            limit = limits.get(name)
            request = requests.get(name, limit)
            if limit is None or _quantity(name, request) != _quantity(name, limit):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed and containers else "Burstable"


def _quantity(resource: str, value: Any) -> float:
    return cpu_cores_from_quantity(value) if resource == "cpu" else memory_bytes_from_quantity(value)


def _labels(pod: Pod) -> Mapping[str, Any]:
    return (pod.get("metadata") or {}).get("labels") or {}


def qos_class_raw(pod: Pod) -> str | None:
    """The QoS label if it names a Koordinator QoS class (what the validating webhook looks at), else None."""
    label = _labels(pod).get(QOS_LABEL)
    return str(label) if label in QOS_CLASSES else None


def koordinator_qos(kubernetes_qos_class: str) -> str:
    """Koordinator's QoS class for a pod without the label: Guaranteed -> LSR, Burstable -> LS, BestEffort -> BE."""
    return {"Guaranteed": "LSR", "Burstable": "LS", "BestEffort": "BE"}[kubernetes_qos_class]


def default_priority_class(qos: str) -> str:
    """Koordinator's priority class for a pod that names none: koord-batch for BE, koord-prod for the others."""
    return BATCH if qos == "BE" else PROD


def qos_class(pod: Pod) -> str:
    """Koordinator QoS: the label if valid, else the default for the pod's Kubernetes QoS class."""
    return qos_class_raw(pod) or koordinator_qos(kubernetes_qos(pod))


def priority_class_of_value(priority: Any) -> str:
    """The priority class whose spec.priority range holds `priority`, else none."""
    if isinstance(priority, int) and not isinstance(priority, bool):
        for name, (low, high) in PRIORITY_RANGES.items():
            if low <= priority <= high:
                return name
    return NONE


def priority_class_raw(pod: Pod) -> str:
    """The label if it names a priority class, else the spec.priority range, else none (no QoS default)."""
    label = _labels(pod).get(PRIORITY_CLASS_LABEL)
    if label in PRIORITY_RANGES:
        return str(label)
    return priority_class_of_value((pod.get("spec") or {}).get("priority"))


def priority_class(pod: Pod) -> str:
    """Koordinator's resolution: label, else spec.priority range, else the QoS default (BE -> batch, others prod)."""
    raw = priority_class_raw(pod)
    if raw != NONE:
        return raw
    return default_priority_class(qos_class(pod))


def _resource_names(pod: Pod) -> Iterable[str]:
    for _, _, container in all_containers(pod):
        resources = container.get("resources") or {}
        for part in ("requests", "limits"):
            yield from resources.get(part) or {}


def violations(pod: Pod) -> list[str]:
    """Why Koordinator's validating webhook would reject this pod on CREATE (empty when it would accept it).

    Like the webhook, it reads the QoS and priority classes as given (label, spec.priority), without defaults.
    """
    qos, priority = qos_class_raw(pod), priority_class_raw(pod)
    problems = []
    if any(name.startswith(EXTENDED_PREFIX[BATCH]) for name in _resource_names(pod)) and qos != "BE":
        problems.append(f"batch resources require QoS BE, not {qos or 'unset'}")
    if qos == "BE" and priority in (PROD, NONE):
        problems.append(f"QoS BE cannot run as priority {priority}")
    if qos == "LSR" and priority != PROD:
        problems.append(f"QoS LSR requires koord-prod, not {priority}")
    if qos in ("LSR", "LSE"):
        for _, _, container in all_containers(pod):
            cpu = ((container.get("resources") or {}).get("requests") or {}).get("cpu")
            if cpu is not None and not cpu_cores_from_quantity(cpu).is_integer():
                problems.append(f"QoS {qos} requires whole CPUs; container {container.get('name')} requests {cpu}")
    return problems


def extended_resources(resources: Mapping[str, Any], priority: str) -> dict[str, Any]:
    """A container's `resources` with cpu/memory renamed for batch/mid pods (CPU in integer milli-cores).

    As a ClusterColocationProfile does: a missing request is copied from the limit. Other classes are returned as is.
    """
    prefix = EXTENDED_PREFIX.get(priority)
    if prefix is None:
        return dict(resources)
    renamed: dict[str, Any] = {k: v for k, v in resources.items() if k not in ("requests", "limits")}
    limits = dict(resources.get("limits") or {})
    requests = dict(resources.get("requests") or {})
    for name in ("cpu", "memory"):
        if name in limits and name not in requests:
            requests[name] = limits[name]
    for part, values in (("requests", requests), ("limits", limits)):
        out = {k: v for k, v in values.items() if k not in ("cpu", "memory")}
        if "cpu" in values:
            out[prefix + "cpu"] = str(cpu_millicores(cpu_cores_from_quantity(values["cpu"])))
        if "memory" in values:
            out[prefix + "memory"] = str(int(memory_bytes_from_quantity(values["memory"])))
        if out:
            renamed[part] = out
    return renamed


def json_object(raw: str | None) -> dict[str, Any]:
    """A JSON object from an annotation value; empty when absent or not an object."""
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _valid_thresholds(values: Any) -> dict[str, float]:
    """The cpu/memory entries of a thresholds object that are percentages in (0, 100]."""
    given = values if isinstance(values, dict) else {}
    return {r: float(given[r]) for r in ("cpu", "memory") if _is_percent(given.get(r))}


def operator_thresholds(annotations: Mapping[str, str] | None) -> dict[str, float]:
    """The usage thresholds (percent, per resource) the operator set on a node, without the ones our writer set.

    Our writer records in WRITTEN_THRESHOLDS_ANNOTATION what it put into Koordinator's annotation and the operator's
    values it replaced: a resource whose current value is still the one we wrote takes the recorded operator value
    (absent: the default applies); any other current value was set by someone else and is the operator's.
    """
    annotations = annotations or {}
    parsed = json_object(annotations.get(USAGE_THRESHOLDS_ANNOTATION))
    current = _valid_thresholds(parsed.get("usageThresholds", parsed))
    record = json_object(annotations.get(WRITTEN_THRESHOLDS_ANNOTATION))
    written, operator = _valid_thresholds(record.get("written")), _valid_thresholds(record.get("operator"))
    found = {}
    for resource in ("cpu", "memory"):
        ours = resource in written and current.get(resource) == written[resource]
        value = operator.get(resource) if ours else current.get(resource)
        if value is not None:
            found[resource] = value
    return found


def usage_thresholds(
    annotations: Mapping[str, str] | None, cpu_percent: float, memory_percent: float
) -> tuple[float, float]:
    """(cpu, memory) usage thresholds in percent: the operator's per-node values (`operator_thresholds`) override the
    defaults; a value our own writer lowered is not one of them (the extender adds the forecast peak itself)."""
    given = operator_thresholds(annotations)
    return given.get("cpu", cpu_percent), given.get("memory", memory_percent)


def _is_percent(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 100
