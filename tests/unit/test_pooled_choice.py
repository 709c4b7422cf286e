"""A group's own choice of candidate is kept only where it costs the fleet's pooled line no more than the gain a group
must show (`keep_pooled_gains`), and the pooled cost of a choice is the one the fleet's candidates are scored with."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.ensemble import CandidateScores, keep_pooled_gains, labelled_costs, pooled_choice_cost
from recommender.arrays import FloatArray, IntArray

P = 288


def _costs_by_own_groups(
    table: dict[frozenset[int], tuple[float, float]], groups: IntArray, fleet_choice: int
) -> object:
    """A pooled (cost, p90) that depends on which groups are off the fleet's candidate, counting its calls."""
    calls: list[frozenset[int]] = []

    def cost(choice: IntArray) -> FloatArray:
        own = frozenset(int(g) for g in np.unique(groups[choice != fleet_choice]))
        calls.append(own)
        return np.array(table[own])

    cost.calls = calls  # type: ignore[attr-defined]
    return cost


def test_a_group_that_makes_the_pool_dearer_goes_back_and_one_that_helps_it_stays() -> None:
    groups = np.repeat([0, 1, 2], 4)
    choice = np.repeat([0, 3, 5], 4)  # the fleet chose 0; groups 1 and 2 chose their own
    table = {
        frozenset({1, 2}): (1.30, 0.02),  # both on their own
        frozenset({2}): (1.00, 0.03),  # group 1 back: the pool is 23 % cheaper, so group 1's own is a loss
        frozenset({1}): (1.40, 0.02),
        frozenset(): (1.10, 0.04),  # the fleet's cost: group 2's own saves 9 %, kept
    }
    fleet = np.array(table[frozenset()])
    cost = _costs_by_own_groups(table, groups, 0)
    kept = keep_pooled_gains(choice, groups, 0, fleet, cost, 0.1, 0.05)  # type: ignore[arg-type]
    assert kept.tolist() == np.repeat([0, 0, 5], 4).tolist()
    # The all-fleet case is read from the fleet's cost, never recomputed.
    assert frozenset() not in cost.calls  # type: ignore[attr-defined]
    # Within the tolerance a group's own choice stays: its evidence is on itself.
    lenient = keep_pooled_gains(choice, groups, 0, fleet, _costs_by_own_groups(table, groups, 0), 0.5, 0.05)  # type: ignore[arg-type]
    assert lenient.tolist() == choice.tolist()
    # Nor does a group go back where that would leave the fleet's line unfair (its p90 past the limit).
    strict = keep_pooled_gains(choice, groups, 0, fleet, _costs_by_own_groups(table, groups, 0), 0.1, 0.025)  # type: ignore[arg-type]
    assert strict.tolist() == choice.tolist()


def test_no_group_on_its_own_costs_no_pooled_scoring() -> None:
    groups = np.repeat([0, 1, 2], 3)
    choice = np.full(9, 4)
    cost = _costs_by_own_groups({}, groups, 4)
    kept = keep_pooled_gains(choice, groups, 4, np.array([1.0, 0.0]), cost, 0.1, 1.0)  # type: ignore[arg-type]
    assert kept.tolist() == choice.tolist()
    assert cost.calls == []  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(
    own=st.lists(st.integers(0, 3), min_size=1, max_size=6),
    costs=st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=64, max_size=64),
    max_loss=st.floats(0.0, 0.9),
    p90_limit=st.floats(0.0, 1.0),
)
def test_groups_only_ever_go_back_to_the_fleets_choice_whole(
    own: list[int], costs: list[float], max_loss: float, p90_limit: float
) -> None:
    groups = np.repeat(np.arange(len(own)), 3)
    groups[-1] = -1  # a container without a group keeps what it has
    choice = np.repeat(np.array(own), 3)
    fleet_choice = 0

    def cost(c: IntArray) -> FloatArray:
        key = sum(1 << int(g) for g in np.unique(groups[(c != fleet_choice) & (groups >= 0)]))
        return np.array([costs[key % len(costs)], costs[(key + 7) % len(costs)] / 10.0])

    kept = keep_pooled_gains(
        choice, groups, fleet_choice, cost(np.full_like(choice, fleet_choice)), cost, max_loss, p90_limit
    )
    for g in range(len(own)):
        members = groups == g
        assert len(set(kept[members].tolist())) == 1
        assert kept[members][0] in (own[g], fleet_choice)
    assert kept[-1] == choice[-1]
    # Where every cost is equal, no group is worse for the pool: all stay.
    flat = np.array([1.0, 0.0])
    same = keep_pooled_gains(choice, groups, fleet_choice, flat, lambda c: flat, max_loss, p90_limit)
    assert same.tolist() == choice.tolist()
    # A group put back never leaves the fleet's line past the fairness limit.
    assert kept.tolist() == choice.tolist() or cost(kept)[1] <= p90_limit


def test_the_pooled_cost_of_one_candidate_for_all_is_the_fleets_cost_of_it() -> None:
    rng = np.random.default_rng(11)
    usage = rng.uniform(0.5, 1.0, size=(7, 60, P))
    usage[:, 40:] *= np.where(rng.random((7, 20, P)) < 0.05, 4.0, 1.0)  # a bursty third
    flat = np.broadcast_to(usage.max(axis=2, keepdims=True).mean(axis=0, keepdims=True), usage.shape)[:, :, :1]
    shaped = usage * 1.5 + 0.2 * rng.random(usage.shape)
    lines = [np.ascontiguousarray(flat), shaped]
    groups = CandidateScores().groups(usage, 3)
    fleet = labelled_costs(lines, usage, 0.05, groups, 3)[3]
    for m in range(2):
        # The same sums in another order: equal to rounding.
        assert pooled_choice_cost(lines, np.full(60, m), usage, 0.05, groups) == pytest.approx(fleet[m], rel=1e-12)
    # A mixed choice (a constant line for one group, a shaped one for the rest) is scored as one fleet.
    mixed = np.where(groups == 2, 0, 1)
    both = pooled_choice_cost(lines, mixed, usage, 0.05, groups)[0]
    assert np.isfinite(both) and both != fleet[0, 0] and both != fleet[1, 0]
