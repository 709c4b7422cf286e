"""The dashboard's overview: current requests against recommendations, risks, totals, QoS and priority defaults."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presentation.overview import overview
from presentation.report import as_csv
from presentation.settings import OverviewSettings
from recommender.resources import (
    CurrentResources,
    History,
    Peak,
    RecommendationSet,
    ResourceRecommendation,
    WorkloadRecommendation,
)
from recommender.units import MIB, memory_on_grid

SETTINGS = OverviewSettings()


def _line(target: float) -> ResourceRecommendation:
    return ResourceRecommendation(
        target=target,
        lower_bound=target / 2,
        upper_bound=target * 2,
        uncapped_target=target,
        short_term=[target] * 3,
        long_term=target,
        peak=Peak(value=target, at=0),
    )


def _rec(
    namespace: str,
    workload: str,
    container: str,
    cpu: float,
    memory: float,
    current: CurrentResources,
    recent_cpu: list[float | None] | None = None,
    recent_memory: list[float | None] | None = None,
    oom_kills: int = 0,
    replicas: int | None = None,
) -> WorkloadRecommendation:
    return WorkloadRecommendation(
        namespace=namespace,
        workload=workload,
        container=container,
        cpu=_line(cpu),
        memory=_line(memory),
        current=current,
        history=History(
            first_sample=0,
            last_sample=100,
            pods=3,
            replicas=replicas,
            samples=10,
            recent_cpu_cores=recent_cpu or [],
            recent_memory_bytes=recent_memory or [],
            oom_kills=oom_kills,
        ),
    )


def _set(*recs: WorkloadRecommendation) -> RecommendationSet:
    return RecommendationSet(as_of=100, horizon_seconds=900, step_seconds=300, recommendations=list(recs))


def test_change_uses_the_request_else_the_limit_and_totals_add_up() -> None:
    result = overview(
        _set(
            _rec("a", "web", "main", 1.0, 2e9, CurrentResources(cpu_request_cores=1.5, memory_request_bytes=1e9)),
            _rec("a", "db", "main", 2.0, 4e9, CurrentResources(cpu_limit_cores=3.0, memory_limit_bytes=5e9)),
            _rec("b", "job", "main", 0.5, 1e9, CurrentResources()),
        ),
        SETTINGS,
    )
    web, db, job = result.workloads
    # The recommended request is the one written, rounded up to the MiB: 2e9 bytes are written as 1908 MiB.
    assert web.memory_bytes.recommended == memory_on_grid(2e9) == 1908 * MIB
    assert web.cpu_cores.change == pytest.approx(-0.5) and web.memory_bytes.change == 1908 * MIB - 1e9
    assert db.cpu_cores.current_request == 3.0 and db.memory_bytes.change == memory_on_grid(4e9) - 5e9
    assert job.cpu_cores.current_request is None and job.cpu_cores.change is None
    # Containers without a current request are left out of the sums (nothing to compare against).
    assert result.namespaces["a"].cpu_request_cores == pytest.approx(4.5)
    assert result.namespaces["a"].cpu_recommended_cores == pytest.approx(3.0)
    assert result.cluster.cpu_change_cores == pytest.approx(-1.5)
    assert result.cluster.memory_change_bytes == memory_on_grid(2e9) + memory_on_grid(4e9) - 6e9
    assert result.cluster.containers == 3 and result.namespaces["b"].containers == 1


def test_qos_is_the_pods_over_all_containers_with_koordinators_defaults() -> None:
    guaranteed = CurrentResources(cpu_limit_cores=1.0, memory_limit_bytes=1e9)
    burstable = CurrentResources(
        cpu_request_cores=0.5, memory_request_bytes=1e9, cpu_limit_cores=1.0, memory_limit_bytes=1e9
    )
    result = overview(
        _set(
            _rec("a", "g", "main", 1, 1e9, guaranteed),
            _rec("a", "mixed", "main", 1, 1e9, guaranteed),
            _rec("a", "mixed", "sidecar", 1, 1e9, burstable),
            _rec("a", "be", "main", 1, 1e9, CurrentResources()),
        ),
        SETTINGS,
    )
    got = {(w.workload, w.container): (w.kubernetes_qos, w.qos_class, w.priority_class) for w in result.workloads}
    assert got[("g", "main")] == ("Guaranteed", "LSR", "koord-prod")
    # One Burstable container makes the whole pod Burstable.
    assert got[("mixed", "main")] == got[("mixed", "sidecar")] == ("Burstable", "LS", "koord-prod")
    assert got[("be", "main")] == ("BestEffort", "BE", "koord-batch")


def test_risks_name_ooms_usage_above_request_and_throttling_in_order() -> None:
    current = CurrentResources(cpu_request_cores=1.0, memory_request_bytes=1e9, cpu_throttled_fraction=0.2)
    risky = _rec(
        "a", "w", "main", 0.5, 0.5e9, current, recent_cpu=[0.5, 1.5, None, 0.5], recent_memory=[2e9, 0.5e9], oom_kills=2
    )
    calm = _rec(
        "a",
        "calm",
        "main",
        0.5,
        0.5e9,
        CurrentResources(cpu_request_cores=1.0, memory_request_bytes=1e9),
        recent_cpu=[0.5],
        recent_memory=[0.5e9],
    )
    rows = overview(_set(risky, calm), SETTINGS).workloads
    assert rows[0].memory_bytes.usage_above_request_fraction == 0.5
    assert rows[0].cpu_cores.usage_above_request_fraction == pytest.approx(1 / 3)  # missing steps do not count
    assert rows[0].risks == [
        "2 OOM kills",
        "memory above request 50% of the last day",
        "CPU throttled in 20% of periods",
        "CPU above request 33% of the last day",
    ]
    assert rows[1].risks == [] and overview(_set(risky, calm), SETTINGS).cluster.at_risk == 1
    short = _rec("a", "short", "main", 2.0, 1e9, CurrentResources(cpu_request_cores=1.0, memory_request_bytes=1e9))
    assert overview(_set(short), SETTINGS).workloads[0].risks == ["CPU request 50% below the recommendation"]


def test_small_differences_are_no_risk_and_the_thresholds_are_settings() -> None:
    """The issue's case: a 14 Mi shortfall on 2 Gi, a stray sample above the request, a little throttling."""
    gib, mib = 2.0**30, 2.0**20
    current = CurrentResources(
        cpu_request_cores=1.0, memory_request_bytes=2 * gib - 14 * mib, cpu_throttled_fraction=0.01
    )
    calm = _rec("a", "w", "main", 1.0, 2 * gib, current, recent_cpu=[0.5] * 199 + [1.2])
    assert overview(_set(calm), SETTINGS).workloads[0].risks == []
    strict = OverviewSettings(
        risk_shortfall_fraction=0.0, risk_usage_above_request_share=0.0, risk_throttled_fraction=0.0
    )
    assert overview(_set(calm), strict).workloads[0].risks == [
        "CPU throttled in 1% of periods",
        "CPU above request under 1% of the last day",
        "memory request under 1% below the recommendation",
    ]


def test_the_issues_cases_against_the_request_per_replica_and_times_replicas() -> None:
    """A 2-core request and no limit; a 500m request and a 4-core limit (against the request, not the limit);
    memory totals that are not zero; three replicas multiply the savings."""
    gib = 2.0**30
    result = overview(
        _set(
            _rec(
                "a",
                "no-limit",
                "main",
                0.5,
                1 * gib,
                CurrentResources(cpu_request_cores=2.0, memory_request_bytes=2 * gib),
                replicas=3,
            ),
            _rec(
                "a",
                "big-limit",
                "main",
                0.25,
                1 * gib,
                CurrentResources(
                    cpu_request_cores=0.5,
                    cpu_limit_cores=4.0,
                    memory_request_bytes=1.5 * gib,
                    memory_limit_bytes=4 * gib,
                ),
            ),
        ),
        SETTINGS,
    )
    no_limit, big_limit = result.workloads
    assert no_limit.cpu_cores.change == pytest.approx(-1.5)
    assert no_limit.cpu_cores.change_all_replicas == pytest.approx(-4.5)
    assert big_limit.cpu_cores.change == pytest.approx(-0.25) and big_limit.replicas == 1
    totals = result.cluster
    assert (totals.cpu_request_cores, totals.cpu_recommended_cores) == pytest.approx((2.5, 0.75))
    assert (totals.cpu_request_cores_all_replicas, totals.cpu_recommended_cores_all_replicas) == pytest.approx(
        (6.5, 1.75)
    )
    assert totals.memory_change_bytes == pytest.approx(-1.5 * gib)
    assert totals.memory_change_bytes_all_replicas == pytest.approx(-3.5 * gib)


def test_a_stale_container_is_marked_and_left_out_of_every_total() -> None:
    """Issue 39: a stale container's page said "Stale" while the totals counted its savings. It is marked per
    resource and per row, counted in `stale`, left out of every sum, and raises no shortfall risk."""
    fresh = _rec("a", "web", "main", 1.0, 2e9, CurrentResources(cpu_request_cores=1.5, memory_request_bytes=1e9))
    gone = _rec("a", "old", "main", 0.025, 1e9, CurrentResources(cpu_request_cores=4.0, memory_request_bytes=1e8))
    assert gone.cpu is not None and gone.memory is not None
    gone = gone.model_copy(
        update={
            "cpu": gone.cpu.model_copy(update={"stale": True}),
            "memory": gone.memory.model_copy(update={"stale": True}),
        }
    )
    result = overview(_set(fresh, gone), SETTINGS)
    row = next(r for r in result.workloads if r.workload == "old")
    assert row.stale and row.cpu_cores.stale and row.memory_bytes.stale and row.risks == []
    alone = overview(_set(fresh), SETTINGS)
    for totals, fresh_only in ((result.cluster, alone.cluster), (result.namespaces["a"], alone.namespaces["a"])):
        assert totals.stale == 1 and totals.containers == 2
        assert totals.model_dump(exclude={"stale", "containers"}) == fresh_only.model_dump(
            exclude={"stale", "containers"}
        )


#: A current request as clusters write them: whole millicores (or a few more decimals, as normalised traces have).
_MILLICORES = st.integers(1, 64_000).map(lambda m: m / 1000) | st.decimals("0.0001", "64", places=4).map(float)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            _MILLICORES, st.integers(1, 64 << 10), st.floats(0.001, 64), st.integers(1, 64 << 10), st.integers(1, 50)
        ),
        min_size=1,
        max_size=8,
    )
)
def test_changes_and_totals_are_as_exact_as_the_quantities(
    containers: list[tuple[float, int, float, int, int]],
) -> None:
    """Every change and total is a nanocore or a byte figure, never binary noise (-1.0168000000000004 cores), and
    a change is still recommended - current: the JSON, the CSV and the dashboard show what a quantity can be."""
    recs = [
        _rec(
            "ns",
            f"w{i}",
            "main",
            cpu,
            float(memory_mib * MIB),
            CurrentResources(cpu_request_cores=request, memory_request_bytes=float(request_mib * MIB)),
            replicas=count,
        )
        for i, (request, request_mib, cpu, memory_mib, count) in enumerate(containers)
    ]
    result = overview(_set(*recs), SETTINGS)
    for row in result.workloads:
        for comparison, decimals in ((row.cpu_cores, 9), (row.memory_bytes, 0)):
            for value in (comparison.change, comparison.change_all_replicas):
                assert value is not None and round(value, decimals) == value
            assert comparison.recommended is not None and comparison.current_request is not None
            assert comparison.change == pytest.approx(comparison.recommended - comparison.current_request, abs=1e-9)
    for name, value in result.cluster.model_dump().items():
        if isinstance(value, float):
            assert round(value, 9 if "cpu" in name else 0) == value, name
    for line in as_csv(result).splitlines()[1:]:
        assert "0000000" not in line and "9999999" not in line, line
