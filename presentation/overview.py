"""The overview of a model version, shared by the dashboard (/api/v1/overview) and `recommender show`: each workload
container's current request against our recommendation, what it risks (usage above its request, OOM kills,
throttling: only past the thresholds of `OverviewSettings`), and totals per namespace and cluster.

Values are per replica (one pod), as requests are, and times the workload's current replicas (`*_all_replicas`).
Every change is recommended - current (`change`, `cpu_change_cores`, ...): negative frees resources, on every surface.
The current request is the container's request, or its limit where only a limit is set (Kubernetes then defaults the
request to the limit). The QoS class is the Kubernetes one
of the workload's pods, computed over all its containers, mapped to Koordinator's default (Guaranteed -> LSR,
Burstable -> LS, BestEffort -> BE), and the priority class is Koordinator's default for that QoS class; both are
what Koordinator assumes when the pods carry no labels.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, Field

from presentation.settings import OverviewSettings
from recommender.koordinator import default_priority_class, koordinator_qos, kubernetes_qos
from recommender.limits import Resource, on_grid
from recommender.resources import RecommendationSet, ResourceRecommendation, WorkloadRecommendation


class ResourceComparison(BaseModel):
    """One resource of one container: what it asks for now against what we recommend."""

    current_request: float | None = Field(
        description="Request, or the limit where only a limit is set; None if neither."
    )
    recommended: float | None = Field(
        description="Recommended request as written: the target rounded up to a whole millicore or MiB, what the "
        "webhook and the YAML write; None without samples."
    )
    recommended_limit: float | None = Field(
        None,
        description="The limit written with it: the recommendation's `limit`, on every surface the same (None "
        "without a current limit).",
    )
    change: float | None = Field(
        description="recommended - current_request, per replica: negative frees resources, positive adds what is missing."
    )
    change_all_replicas: float | None = Field(description="change x the workload's current replicas.")
    usage_above_request_fraction: float | None = Field(
        description="Share of the last day's usage steps above the current request; None without both."
    )
    usage_above_recommended_fraction: float | None = Field(
        None,
        description="Share of the last day's usage steps (each 5 minutes' busiest pod) above the recommended request "
        "as written (on the quantity grid): this container's own, beside the risk level the lines are calibrated to "
        "over the fleet (which counts every pod's samples: a busiest pod passes a request more often); None without "
        "both.",
    )
    stale: bool = Field(
        False,
        description="No sample for days: no fresh forecast, the webhook leaves the container alone, and the totals "
        "leave this resource out (its recommendation frees or adds nothing).",
    )


class WorkloadSummary(BaseModel):
    """One row of the overview."""

    namespace: str
    workload: str
    container: str
    kind: str | None
    kubernetes_qos: str = Field(description="Guaranteed, Burstable or BestEffort, over the workload's containers.")
    qos_class: str = Field(description="Koordinator's default QoS class for it (LSR, LS, BE).")
    priority_class: str = Field(
        description="Koordinator's default priority class for that QoS (koord-prod, koord-batch)."
    )
    pods: int = Field(description="Distinct pods seen over the history.")
    replicas: int = Field(description="Pods running at the newest sample (1 where the version did not record it).")
    last_sample: int | None
    cpu_cores: ResourceComparison
    memory_bytes: ResourceComparison
    oom_kills: int
    cpu_throttled_fraction: float | None
    risks: list[str] = Field(
        description="Why the workload may be short of resources, most serious first; empty if none."
    )
    ceiling_rules: list[str] = Field(
        default_factory=list,
        description="Each line the usage ceiling touched, as `<resource> <line>: <rule>` (the recommendation's "
        "`ceiling_rules`: held at max(limit, highest sample), or the evidence that lets it stand above).",
    )
    stale: bool = Field(False, description="Either resource is stale (see `ResourceComparison.stale`).")


class Totals(BaseModel):
    """Sums over containers that have both a current request and a fresh recommendation, per resource: a stale one
    (no sample for days) is counted in `stale` and left out of every sum."""

    containers: int
    at_risk: int = Field(description="Containers with at least one risk.")
    stale: int = Field(0, description="Stale containers, left out of the sums (of that resource, or both).")
    cpu_request_cores: float
    cpu_recommended_cores: float
    cpu_change_cores: float = Field(description="cpu_recommended_cores - cpu_request_cores: negative frees cores.")
    memory_request_bytes: float
    memory_recommended_bytes: float
    memory_change_bytes: float = Field(description="The same for memory: negative frees bytes.")
    cpu_request_cores_all_replicas: float = Field(description="The same sums, each container times its replicas.")
    cpu_recommended_cores_all_replicas: float
    cpu_change_cores_all_replicas: float
    memory_request_bytes_all_replicas: float
    memory_recommended_bytes_all_replicas: float
    memory_change_bytes_all_replicas: float


class Overview(BaseModel):
    as_of: int
    cluster: Totals
    namespaces: dict[str, Totals]
    workloads: list[WorkloadSummary]


#: Decimals a derived figure (a change, a sum) keeps: CPU to the nanocore, Kubernetes' finest CPU quantity, memory to
#: the byte. Sums and differences of decimal quantities otherwise show binary noise (42.218999999999994 cores).
_DECIMALS: dict[Resource, int] = {"cpu": 9, "memory": 0}


def _tidy(resource: Resource, value: float) -> float:
    """A sum or difference of quantities, as exact as the quantities are (`_DECIMALS`)."""
    return round(value, _DECIMALS[resource]) + 0.0  # + 0.0: -0.0 shows as 0.0


def _current(rec: WorkloadRecommendation, resource: str) -> float | None:
    current = rec.current
    if resource == "cpu":
        return current.cpu_request_cores if current.cpu_request_cores is not None else current.cpu_limit_cores
    return current.memory_request_bytes if current.memory_request_bytes is not None else current.memory_limit_bytes


def _comparison(
    resource: Resource,
    learned: ResourceRecommendation | None,
    request: float | None,
    recent: Sequence[float | None],
    replicas: int,
) -> ResourceComparison:
    seen = [v for v in recent if v is not None]
    # The request as written (rounded up to the millicore or MiB the webhook and the YAML write): the figure every
    # surface states and the totals add up, not the model's unrounded target a millicore below it.
    written = None if learned is None else on_grid(resource, learned.target)
    change = None if written is None or request is None else written - request
    return ResourceComparison(
        stale=learned is not None and learned.stale,
        current_request=request,
        recommended=written,
        recommended_limit=None if learned is None else learned.limit,
        change=None if change is None else _tidy(resource, change),
        change_all_replicas=None if change is None else _tidy(resource, change * replicas),
        usage_above_request_fraction=_share_above(seen, request),
        usage_above_recommended_fraction=_share_above(seen, written),
    )


def _share_above(seen: Sequence[float], level: float | None) -> float | None:
    """The share of the usage steps `seen` above `level`; None without either."""
    return None if level is None or not seen else sum(v > level for v in seen) / len(seen)


def _resources(rec: WorkloadRecommendation) -> dict[str, dict[str, float]]:
    """The container's resources as a pod spec has them (numbers are valid quantities)."""
    current = rec.current
    requests = {"cpu": current.cpu_request_cores, "memory": current.memory_request_bytes}
    limits = {"cpu": current.cpu_limit_cores, "memory": current.memory_limit_bytes}
    return {
        "requests": {k: v for k, v in requests.items() if v is not None},
        "limits": {k: v for k, v in limits.items() if v is not None},
    }


def _share(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.01 else "under 1%"


def _risks(
    oom_kills: int,
    cpu: ResourceComparison,
    memory: ResourceComparison,
    throttled: float | None,
    settings: OverviewSettings,
) -> list[str]:
    """Why the container may be short, most serious first: only what passes the thresholds."""
    risks = []
    if oom_kills:
        risks.append(f"{oom_kills} OOM kill{'s' if oom_kills > 1 else ''}")
    above = settings.risk_usage_above_request_share
    if (memory.usage_above_request_fraction or 0) > above:
        risks.append(f"memory above request {_share(memory.usage_above_request_fraction or 0)} of the last day")
    if (throttled or 0) > settings.risk_throttled_fraction:
        risks.append(f"CPU throttled in {_share(throttled or 0)} of periods")
    if (cpu.usage_above_request_fraction or 0) > above:
        risks.append(f"CPU above request {_share(cpu.usage_above_request_fraction or 0)} of the last day")
    for name, comparison in (("memory", memory), ("CPU", cpu)):
        short = comparison.change
        if (
            not comparison.stale
            and short is not None
            and comparison.recommended
            and short > settings.risk_shortfall_fraction * comparison.recommended
        ):
            risks.append(f"{name} request {_share(short / comparison.recommended)} below the recommendation")
    return risks


def replicas(rec: WorkloadRecommendation) -> int:
    """The workload's current replicas, 1 where the version did not record them (never overstating savings)."""
    return rec.history.replicas if rec.history is not None and rec.history.replicas else 1


def _summary(rec: WorkloadRecommendation, qos: str, settings: OverviewSettings) -> WorkloadSummary:
    history = rec.history
    count = replicas(rec)
    cpu = _comparison("cpu", rec.cpu, _current(rec, "cpu"), history.recent_cpu_cores if history else [], count)
    memory = _comparison(
        "memory", rec.memory, _current(rec, "memory"), history.recent_memory_bytes if history else [], count
    )
    oom_kills = history.oom_kills if history else 0
    koordinator = koordinator_qos(qos)
    return WorkloadSummary(
        namespace=rec.namespace,
        workload=rec.workload,
        container=rec.container,
        kind=rec.kind,
        kubernetes_qos=qos,
        qos_class=koordinator,
        priority_class=default_priority_class(koordinator),
        pods=history.pods if history else 0,
        replicas=count,
        last_sample=history.last_sample if history else None,
        cpu_cores=cpu,
        memory_bytes=memory,
        oom_kills=oom_kills,
        cpu_throttled_fraction=rec.current.cpu_throttled_fraction,
        risks=_risks(oom_kills, cpu, memory, rec.current.cpu_throttled_fraction, settings),
        ceiling_rules=[
            f"{name} {line}: {rule}"
            for name, learned in (("cpu", rec.cpu), ("memory", rec.memory))
            if learned is not None
            for line, rule in learned.ceiling_rules.items()
        ],
        stale=cpu.stale or memory.stale,
    )


def _totals(rows: Sequence[WorkloadSummary]) -> Totals:
    sums: dict[str, float] = defaultdict(float)
    for row in rows:
        for resource, comparison in (("cpu", row.cpu_cores), ("memory", row.memory_bytes)):
            if comparison.current_request is not None and comparison.recommended is not None and not comparison.stale:
                for suffix, factor in (("", 1), ("_all_replicas", row.replicas)):
                    sums[f"{resource}_request{suffix}"] += comparison.current_request * factor
                    sums[f"{resource}_recommended{suffix}"] += comparison.recommended * factor
    values = {}
    units: tuple[tuple[Resource, str], ...] = (("cpu", "cores"), ("memory", "bytes"))
    for resource, unit in units:
        for suffix in ("", "_all_replicas"):
            request, recommended = sums[f"{resource}_request{suffix}"], sums[f"{resource}_recommended{suffix}"]
            values[f"{resource}_request_{unit}{suffix}"] = _tidy(resource, request)
            values[f"{resource}_recommended_{unit}{suffix}"] = _tidy(resource, recommended)
            values[f"{resource}_change_{unit}{suffix}"] = _tidy(resource, recommended - request)
    return Totals(
        containers=len(rows),
        at_risk=sum(bool(row.risks) for row in rows),
        stale=sum(row.stale for row in rows),
        **values,
    )


def overview(recommendations: RecommendationSet, settings: OverviewSettings) -> Overview:
    """Every container's comparison and risks, and the totals per namespace and for the whole set."""
    pods: dict[tuple[str, str], list[dict[str, dict[str, dict[str, float]]]]] = defaultdict(list)
    for rec in recommendations.recommendations:
        pods[(rec.namespace, rec.workload)].append({"resources": _resources(rec)})
    qos = {key: kubernetes_qos({"spec": {"containers": containers}}) for key, containers in pods.items()}
    rows = [_summary(rec, qos[(rec.namespace, rec.workload)], settings) for rec in recommendations.recommendations]
    per_namespace: dict[str, list[WorkloadSummary]] = defaultdict(list)
    for row in rows:
        per_namespace[row.namespace].append(row)
    return Overview(
        as_of=recommendations.as_of,
        cluster=_totals(rows),
        namespaces={namespace: _totals(part) for namespace, part in sorted(per_namespace.items())},
        workloads=rows,
    )
