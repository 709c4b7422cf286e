"""The dashboard's overview: current requests against recommendations, risks, totals, QoS and priority defaults."""

from __future__ import annotations

import pytest

from recommender.overview import overview
from recommender.resources import CurrentResources, History, Peak, RecommendationSet, ResourceRecommendation, WorkloadRecommendation


def _line(target: float) -> ResourceRecommendation:
    return ResourceRecommendation(
        target=target, lower_bound=target / 2, upper_bound=target * 2, uncapped_target=target,
        short_term=[target] * 3, long_term=target, peak=Peak(value=target, at=0),
    )


def _rec(namespace: str, workload: str, container: str, cpu: float, memory: float, current: CurrentResources,
         recent_cpu: list[float | None] | None = None, recent_memory: list[float | None] | None = None,
         oom_kills: int = 0) -> WorkloadRecommendation:
    return WorkloadRecommendation(
        namespace=namespace, workload=workload, container=container, cpu=_line(cpu), memory=_line(memory), current=current,
        history=History(first_sample=0, last_sample=100, pods=3, samples=10, recent_cpu_cores=recent_cpu or [],
                        recent_memory_bytes=recent_memory or [], oom_kills=oom_kills),
    )


def _set(*recs: WorkloadRecommendation) -> RecommendationSet:
    return RecommendationSet(as_of=100, horizon_seconds=900, step_seconds=300, recommendations=list(recs))


def test_difference_uses_the_request_else_the_limit_and_totals_add_up() -> None:
    result = overview(_set(
        _rec("a", "web", "main", 1.0, 2e9, CurrentResources(cpu_request_cores=1.5, memory_request_bytes=1e9)),
        _rec("a", "db", "main", 2.0, 4e9, CurrentResources(cpu_limit_cores=3.0, memory_limit_bytes=5e9)),
        _rec("b", "job", "main", 0.5, 1e9, CurrentResources()),
    ))
    web, db, job = result.workloads
    assert web.cpu_cores.difference == pytest.approx(0.5) and web.memory_bytes.difference == pytest.approx(-1e9)
    assert db.cpu_cores.current_request == 3.0 and db.memory_bytes.difference == pytest.approx(1e9)
    assert job.cpu_cores.current_request is None and job.cpu_cores.difference is None
    # Containers without a current request are left out of the sums (nothing to compare against).
    assert result.namespaces["a"].cpu_request_cores == pytest.approx(4.5)
    assert result.namespaces["a"].cpu_recommended_cores == pytest.approx(3.0)
    assert result.cluster.cpu_difference_cores == pytest.approx(1.5)
    assert result.cluster.memory_difference_bytes == pytest.approx(0.0)
    assert result.cluster.containers == 3 and result.namespaces["b"].containers == 1


def test_qos_is_the_pods_over_all_containers_with_koordinators_defaults() -> None:
    guaranteed = CurrentResources(cpu_limit_cores=1.0, memory_limit_bytes=1e9)
    burstable = CurrentResources(cpu_request_cores=0.5, memory_request_bytes=1e9, cpu_limit_cores=1.0, memory_limit_bytes=1e9)
    result = overview(_set(
        _rec("a", "g", "main", 1, 1e9, guaranteed),
        _rec("a", "mixed", "main", 1, 1e9, guaranteed),
        _rec("a", "mixed", "sidecar", 1, 1e9, burstable),
        _rec("a", "be", "main", 1, 1e9, CurrentResources()),
    ))
    got = {(w.workload, w.container): (w.kubernetes_qos, w.qos_class, w.priority_class) for w in result.workloads}
    assert got[("g", "main")] == ("Guaranteed", "LSR", "koord-prod")
    # One Burstable container makes the whole pod Burstable.
    assert got[("mixed", "main")] == got[("mixed", "sidecar")] == ("Burstable", "LS", "koord-prod")
    assert got[("be", "main")] == ("BestEffort", "BE", "koord-batch")


def test_risks_name_ooms_usage_above_request_and_throttling_in_order() -> None:
    current = CurrentResources(cpu_request_cores=1.0, memory_request_bytes=1e9, cpu_throttled_fraction=0.2)
    risky = _rec("a", "w", "main", 0.5, 0.5e9, current, recent_cpu=[0.5, 1.5, None, 0.5], recent_memory=[2e9, 0.5e9], oom_kills=2)
    calm = _rec("a", "calm", "main", 0.5, 0.5e9, CurrentResources(cpu_request_cores=1.0, memory_request_bytes=1e9),
                recent_cpu=[0.5], recent_memory=[0.5e9])
    rows = overview(_set(risky, calm)).workloads
    assert rows[0].memory_bytes.usage_above_request_fraction == 0.5
    assert rows[0].cpu_cores.usage_above_request_fraction == pytest.approx(1 / 3)  # missing steps do not count
    assert rows[0].risks == [
        "2 OOM kills", "memory above request 50% of the last day", "CPU throttled in 20% of periods",
        "CPU above request 33% of the last day",
    ]
    assert rows[1].risks == [] and overview(_set(risky, calm)).cluster.at_risk == 1
    short = _rec("a", "short", "main", 2.0, 1e9, CurrentResources(cpu_request_cores=1.0, memory_request_bytes=1e9))
    assert overview(_set(short)).workloads[0].risks == ["CPU request below the recommendation"]
