"""Hotspot-aware placement: forecast peaks over time of day against allocatable, thresholds, neutral answers."""

from __future__ import annotations

import pytest

from recommender import koordinator as k
from recommender.placement import NodeLoads, Timeline, judge, node_capacity
from recommender.units import GIB
from serving.settings import ExtenderSettings
from tests.k8s import container, node, pod, running
from tests.recs import STEPS, lookup_of, recommendation

AS_OF = 1_800_000_000
TIMELINE = Timeline(AS_OF, 300, STEPS)
SETTINGS = ExtenderSettings(window_seconds=24 * 3600)


def spike(hour: int, high: float, low: float = 0.5) -> list[float]:
    """A day of 5-minute steps from as_of at `low`, with a 2-hour spike at `high` starting at `hour`."""
    return [high if hour * 12 <= i < (hour + 2) * 12 else low for i in range(STEPS)]


RECS = lookup_of(
    recommendation("ns", "morning", "main", 1, GIB, cpu_line=spike(8, 6)),
    recommendation("ns", "evening", "main", 1, GIB, cpu_line=spike(20, 6)),
    recommendation("ns", "incoming", "main", 1, GIB, cpu_line=spike(8, 5)),
)


def placed(workload: str, node_name: str, index: int) -> dict[str, object]:
    return running(
        pod("deployment", workload, [container("main", {"requests": {"cpu": "1"}})]),
        "ns",
        node_name,
        f"{workload}-{index}",
    )


def loads(nodes: list[dict[str, object]]) -> NodeLoads:
    pods = [placed("morning", "a", 0), placed("evening", "b", 0)]
    return NodeLoads.build(pods, nodes, RECS.get, TIMELINE, SETTINGS)


INCOMING = pod("deployment", "incoming", [container("main", {"requests": {"cpu": "1"}})])
INCOMING["metadata"]["namespace"] = "ns"


def test_pod_goes_where_its_spike_does_not_meet_another() -> None:
    view = loads([node("a", cpu="16"), node("b", cpu="16")])
    found = judge(view, INCOMING, ["a", "b"], {}, RECS.get, SETTINGS, AS_OF)
    # Both nodes carry the same average load; only b keeps the 8 o'clock spikes apart.
    assert found.cpu_percent == [(6 + 5) * 100 / 16, (6 + 0.5) * 100 / 16]
    assert found.scores[1] > found.scores[0]
    assert found.failed == {"a": "forecast CPU peak 69% of allocatable > 65%"}


def test_window_follows_the_clock_and_wraps_by_time_of_day() -> None:
    view = loads([node("a", cpu="16"), node("b", cpu="16")])
    short = ExtenderSettings(window_seconds=3600)
    at_ten = AS_OF + 10 * 3600  # the incoming pod's spike (8-10 h) is over for the next hour
    assert judge(view, INCOMING, ["a", "b"], {}, RECS.get, short, at_ten).cpu_percent == [1 * 100 / 16] * 2
    next_day = AS_OF + 24 * 3600 + 8 * 3600
    assert judge(view, INCOMING, ["a", "b"], {}, RECS.get, short, next_day).cpu_percent[0] == 11 * 100 / 16


def test_node_annotation_overrides_threshold_and_call_capacity_wins() -> None:
    relaxed = node("a", cpu="16", annotations={k.USAGE_THRESHOLDS_ANNOTATION: '{"usageThresholds": {"cpu": 80}}'})
    view = loads([relaxed, node("b")])
    assert judge(view, INCOMING, ["a"], {}, RECS.get, SETTINGS, AS_OF).failed == {}
    strict = ExtenderSettings(window_seconds=24 * 3600, cpu_threshold_percent=10)
    assert list(judge(loads([node("a")]), INCOMING, ["a"], {}, RECS.get, strict, AS_OF).failed) == ["a"]
    bigger = node_capacity(node("a", cpu="64"), SETTINGS)
    assert bigger is not None
    found = judge(view, INCOMING, ["a"], {"a": bigger}, RECS.get, SETTINGS, AS_OF)
    assert found.failed == {} and found.cpu_percent == [11 * 100 / 64]


def test_unknown_nodes_and_unknown_pods_get_neutral_answers() -> None:
    view = loads([node("a", cpu="4")])
    found = judge(view, INCOMING, ["a", "ghost"], {}, RECS.get, SETTINGS, AS_OF)
    assert found.known == [True, False] and list(found.failed) == ["a"] and found.scores[1] == SETTINGS.neutral_score
    stranger = pod("bare", "stranger", [container("main", {"requests": {"cpu": "64"}})])
    found = judge(view, stranger, ["a", "ghost"], {}, RECS.get, SETTINGS, AS_OF)
    assert found.failed == {} and found.scores == [SETTINGS.neutral_score] * 2


def test_placed_pods_without_recommendation_count_their_request_or_the_defaults() -> None:
    requested = running(
        pod("bare", "stranger", [container("main", {"requests": {"cpu": "2", "memory": "1Gi"}})]), "ns", "m", "s"
    )
    empty = running(pod("bare", "nothing", [container("main", None)]), "ns", "m", "n")
    memory = NodeLoads.build([requested, empty], [node("m", cpu="16", memory="4Gi")], RECS.get, TIMELINE, SETTINGS)
    found = judge(memory, INCOMING, ["m"], {}, RECS.get, SETTINGS, AS_OF)
    assert found.cpu_percent == [(2 + SETTINGS.default_cpu_cores + 5) * 100 / 16]
    assert found.memory_percent == [pytest.approx((1 * GIB + SETTINGS.default_memory_bytes + GIB) * 100 / (4 * GIB))]


def test_finished_pods_and_bad_nodes_do_not_count() -> None:
    done = placed("morning", "a", 1)
    done["status"] = {"phase": "Succeeded"}
    broken = {"metadata": {"name": "x"}, "status": {"allocatable": {"cpu": "lots"}}}
    view = NodeLoads.build([done], [node("a"), broken], RECS.get, TIMELINE, SETTINGS)
    assert list(view.index) == ["a"] and view.cpu_cores.sum() == 0 and view.cpu_cores.shape == (STEPS, 2)
