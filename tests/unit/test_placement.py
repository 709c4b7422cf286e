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
    assert found.cpu_percent.tolist() == [(6 + 5) * 100 / 16, (6 + 0.5) * 100 / 16]
    assert found.scores[1] > found.scores[0]
    assert found.failed == {"a": "forecast CPU peak 69% of allocatable > 65%"}


def test_window_follows_the_clock_and_wraps_by_time_of_day() -> None:
    view = loads([node("a", cpu="16"), node("b", cpu="16")])
    short = ExtenderSettings(window_seconds=3600)
    at_ten = AS_OF + 10 * 3600  # the incoming pod's spike (8-10 h) is over for the next hour
    assert judge(view, INCOMING, ["a", "b"], {}, RECS.get, short, at_ten).cpu_percent.tolist() == [1 * 100 / 16] * 2
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
    assert found.failed == {} and found.cpu_percent.tolist() == [11 * 100 / 64]


def test_unknown_nodes_and_unknown_pods_get_neutral_answers() -> None:
    view = loads([node("a", cpu="4")])
    found = judge(view, INCOMING, ["a", "ghost"], {}, RECS.get, SETTINGS, AS_OF)
    assert found.known.tolist() == [True, False] and list(found.failed) == ["a"]
    assert found.scores[1] == SETTINGS.neutral_score
    stranger = pod("bare", "stranger", [container("main", {"requests": {"cpu": "64"}})])
    found = judge(view, stranger, ["a", "ghost"], {}, RECS.get, SETTINGS, AS_OF)
    assert found.failed == {} and found.scores.tolist() == [SETTINGS.neutral_score] * 2


def test_placed_pods_without_recommendation_count_their_request_or_the_defaults() -> None:
    requested = running(
        pod("bare", "stranger", [container("main", {"requests": {"cpu": "2", "memory": "1Gi"}})]), "ns", "m", "s"
    )
    empty = running(pod("bare", "nothing", [container("main", None)]), "ns", "m", "n")
    memory = NodeLoads.build([requested, empty], [node("m", cpu="16", memory="4Gi")], RECS.get, TIMELINE, SETTINGS)
    found = judge(memory, INCOMING, ["m"], {}, RECS.get, SETTINGS, AS_OF)
    assert found.cpu_percent.tolist() == [(2 + SETTINGS.default_cpu_cores + 5) * 100 / 16]
    assert found.memory_percent.tolist() == [
        pytest.approx((1 * GIB + SETTINGS.default_memory_bytes + GIB) * 100 / (4 * GIB))
    ]


def test_finished_pods_and_bad_nodes_do_not_count() -> None:
    done = placed("morning", "a", 1)
    done["status"] = {"phase": "Succeeded"}
    broken = {"metadata": {"name": "x"}, "status": {"allocatable": {"cpu": "lots"}}}
    view = NodeLoads.build([done], [node("a"), broken], RECS.get, TIMELINE, SETTINGS)
    assert list(view.index) == ["a"] and view.cpu_cores.sum() == 0 and view.cpu_cores.shape == (STEPS, 2)


@pytest.mark.parametrize("window_seconds", [300, 3600, 6 * 3600, 23 * 3600, 24 * 3600, 30 * 3600])
def test_window_spans_cover_the_same_steps_as_the_window(window_seconds: int) -> None:
    for now in range(AS_OF - 3600, AS_OF + 3 * 24 * 3600, 3571):
        spans = TIMELINE.spans(now, window_seconds)
        covered = [step for start, stop in spans for step in range(start, stop)]
        assert len(spans) <= 2 and len(covered) == len(set(covered))
        assert set(covered) == set(TIMELINE.window(now, window_seconds).tolist())


def test_few_and_many_candidates_and_unusable_names_are_judged_alike() -> None:
    """Peaks over gathered columns (few candidates) and over every node (many) agree; names that are not
    strings are left out and unknown ones are neutral, wherever they stand in the call."""
    nodes = [node(f"n{i}", cpu="16") for i in range(12)]
    pods = [placed("morning" if i % 3 else "evening", f"n{i % 12}", i) for i in range(30)]
    view = NodeLoads.build(pods, nodes, RECS.get, TIMELINE, SETTINGS)
    short = ExtenderSettings(window_seconds=4 * 3600)
    for now in (AS_OF + 7 * 3600, AS_OF + 22 * 3600):  # the second window wraps past the end of the lines
        many = judge(view, INCOMING, list(view.index), {}, RECS.get, short, now)
        for name in view.index:
            one = judge(view, INCOMING, [name], {}, RECS.get, short, now)
            position = many.nodes.index(name)
            assert one.cpu_percent[0] == many.cpu_percent[position]
            assert one.memory_percent[0] == many.memory_percent[position]
            assert one.scores[0] == many.scores[position] and one.failed == {
                k: v for k, v in many.failed.items() if k == name
            }
    mixed = judge(view, INCOMING, ["n3", 7, None, "ghost", ["n1"], "n1"], {}, RECS.get, short, AS_OF)
    assert list(mixed.nodes) == ["n3", "ghost", "n1"] and mixed.known.tolist() == [True, False, True]
    assert mixed.scores[1] == short.neutral_score and mixed.rows[1] == len(view.index)


def test_prioritize_answer_records_read_as_the_json_of_each_score() -> None:
    import numpy as np
    import orjson

    from serving.cluster import HostRecords, scored

    known = ["a", 'quo"te', "ünï", "node-00010"]
    records = HostRecords(known)
    names = ["node-00010", "ghost\\n", "a", "a", 'quo"te', "ünï"]
    rows = np.array([3, 4, 0, 0, 1, 2])
    scores = np.array([10, 0, 5, 9, 1, 10])
    answer = scored(records.layout(names, rows), scores)
    assert orjson.loads(answer) == [{"Host": n, "Score": int(s)} for n, s in zip(names, scores, strict=True)]
    none = np.array([], dtype=np.int64)
    assert orjson.loads(scored(records.layout([], none), none)) == []
