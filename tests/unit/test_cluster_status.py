"""The VPA status's RecommendationStale condition: the live update's age as VPA users read it (conditions)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from recommender.cluster_status import LiveFreshness, vpa_status
from recommender.resources import CurrentResources, History, Peak, ResourceRecommendation, WorkloadRecommendation

VPA = {"spec": {"targetRef": {"kind": "Deployment", "name": "a"}}}


def _rec() -> WorkloadRecommendation:
    cpu = ResourceRecommendation(
        target=0.5, lower_bound=0.4, upper_bound=0.9, uncapped_target=0.5, short_term=[0.5], long_term=0.5,
        peak=Peak(value=0.5, at=0),
    )  # fmt: skip
    return WorkloadRecommendation(
        namespace="shop", workload="a", container="app", cpu=cpu, memory=None, current=CurrentResources(),
        history=History(first_sample=0, last_sample=2 * 86400, pods=1, samples=10),
    )  # fmt: skip


def _stale(status: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == "RecommendationStale")
    return found


@given(stale=st.booleans(), written_at=st.floats(1e9, 2e9), flips=st.lists(st.booleans(), max_size=5))
def test_the_stale_condition_follows_the_update_and_keeps_its_transition_time_while_unchanged(
    stale: bool, written_at: float, flips: list[bool]
) -> None:
    live = LiveFreshness("v+live.3", written_at, 300.0, stale)
    status = vpa_status([_rec()], VPA, live.revision, live)
    first = _stale(status)
    assert first["status"] == ("True" if stale else "False")
    assert first["reason"] == ("LiveUpdateAgeing" if stale else "LiveUpdateFresh")
    # The message names when the update was written, not its age: the same update gives the same status.
    previous = {"spec": VPA["spec"], "status": status}
    again = vpa_status([_rec()], previous, live.revision, live)
    assert again == status
    for flip in flips:
        changed = LiveFreshness(live.revision, written_at, 300.0, flip)
        following = _stale(vpa_status([_rec()], previous, live.revision, changed))
        assert following["status"] == ("True" if flip else "False")
        if flip == stale:
            assert following["lastTransitionTime"] == first["lastTransitionTime"]


def test_no_live_update_no_condition_and_none_beside_no_recommendation() -> None:
    assert {c["type"] for c in vpa_status([_rec()], VPA, "v")["conditions"]} == {
        "RecommendationProvided",
        "LowConfidence",
    }
    live = LiveFreshness("v+live.1", 1e9, 300.0, True)
    assert [c["type"] for c in vpa_status([], VPA, "v", live)["conditions"]] == ["RecommendationProvided"]
