"""Hand-made recommendations, for tests that need exact numbers rather than a trained model."""

from __future__ import annotations

from recommender.identity import WorkloadKey
from recommender.resources import Peak, ResourceRecommendation, WorkloadRecommendation

STEPS = 288


def resource(target: float, line: list[float] | None = None, long_term: float | None = None) -> ResourceRecommendation:
    short_term = line if line is not None else [target] * STEPS
    peak = max(short_term)
    return ResourceRecommendation(
        target=target,
        lower_bound=target / 2,
        upper_bound=target * 1.5,
        uncapped_target=target,
        short_term=short_term,
        long_term=target * 0.8 if long_term is None else long_term,
        peak=Peak(value=peak, at=short_term.index(peak) * 300),
    )


def recommendation(
    namespace: str,
    workload: str,
    container: str,
    cpu_cores: float,
    memory_bytes: float,
    cpu_line: list[float] | None = None,
    memory_line: list[float] | None = None,
) -> WorkloadRecommendation:
    return WorkloadRecommendation(
        namespace=namespace,
        workload=workload,
        container=container,
        cpu=resource(cpu_cores, cpu_line),
        memory=resource(memory_bytes, memory_line),
    )


def lookup_of(*recs: WorkloadRecommendation) -> dict[WorkloadKey, WorkloadRecommendation]:
    return {r.key: r for r in recs}
