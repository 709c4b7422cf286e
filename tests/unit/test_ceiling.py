"""The usage ceiling (`recommender.ceiling`): no line above max(limit, highest sample) without evidence, and where
evidence lets one stand above, its rule says why."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from recommender.ceiling import (
    ABOVE,
    CAPPED,
    ceiling_evidence,
    ceiling_rules,
    ceilings_at,
    usage_ceiling,
    within_ceiling,
)

NAN = float("nan")
GIB = 2.0**30
amount = st.floats(0, 1e12, allow_nan=False)
maybe = st.one_of(amount, st.just(NAN))
reason = st.one_of(st.none(), st.just("2 OOM kills in the history"))


def test_the_demo_job_is_held_at_its_limit() -> None:
    # issue 39: a 13.03 Gi limit, never above 10.62 GiB, lines at 14.73 / 16.41 / 17.55 Gi
    limit, highest = np.array([13.03 * GIB]), np.array([10.62 * GIB])
    ceiling = usage_ceiling(limit, highest)
    assert ceiling.tolist() == [13.03 * GIB]
    evidence = ceiling_evidence(limit, highest, [0], [NAN], 0.95, 0.05)
    assert evidence == [None]
    lines = {"short_term": np.array([[12.0 * GIB, 14.73 * GIB]]), "long_term": np.array([16.41 * GIB])}
    held = {name: within_ceiling(values, ceiling, evidence) for name, values in lines.items()}
    assert held["short_term"].tolist() == [[12.0 * GIB, 13.03 * GIB]]
    assert held["long_term"].tolist() == [13.03 * GIB]
    rules = ceiling_rules(lines, dict.fromkeys(lines, ceiling), evidence)
    assert rules == [{"short_term": CAPPED, "long_term": CAPPED}]


def test_without_a_limit_the_highest_sample_bounds_and_without_either_nothing() -> None:
    # NaN and 0 are no limit (0 is how an unset limit is written)
    assert usage_ceiling([NAN, 0.0, 2.0, NAN], [1.5, 1.5, 1.5, NAN])[:3].tolist() == [1.5, 1.5, 2.0]
    assert np.isnan(usage_ceiling([NAN], [NAN])[0])
    assert within_ceiling(np.array([9.0]), np.array([NAN]), [None]).tolist() == [9.0]


def test_each_kind_of_evidence_is_named() -> None:
    found = ceiling_evidence(
        [4.0, 4.0, 4.0, 4.0, NAN],
        [1.0, 3.9, 1.0, 1.0, 3.9],
        [0, 0, 1, 3, 0],
        [NAN, NAN, NAN, 0.2, 0.01],
        0.95,
        0.05,
    )
    assert found[0] is None and found[4] is None  # far from a limit; no limit to be near, little throttling
    assert found[1] == "usage reached 98 % of the limit"
    assert found[2] == "1 OOM kill in the history"
    assert found[3] == "3 OOM kills in the history; throttled in 20 % of CFS periods"


def test_evidence_lets_a_line_stand_above_and_says_why() -> None:
    ceiling, evidence = np.array([2.0, 2.0]), [None, "throttled in 20 % of CFS periods"]
    line = np.array([3.0, 3.0])
    assert within_ceiling(line, ceiling, evidence).tolist() == [2.0, 3.0]
    assert ceiling_rules({"target": line}, {"target": ceiling}, evidence) == [
        {"target": CAPPED},
        {"target": ABOVE + "throttled in 20 % of CFS periods"},
    ]


def test_decisions_on_grids_see_only_the_columns_before_them() -> None:
    # the backtest's and the replay's ceilings: the newest limit and the highest usage of the window before each
    usage = np.array([[1.0, 5.0, 2.0, 9.0], [1.0, 1.0, 1.0, 1.0]])
    limit = np.array([[NAN, 8.0, NAN, 10.0], [NAN] * 4])
    throttled = np.array([[NAN] * 4, [NAN, NAN, 0.5, NAN]])
    ceiling, evidence = ceilings_at(usage, limit, throttled, [2, 3, 4], 2, 0.95, 0.05)
    assert ceiling.tolist() == [[8.0, 1.0], [8.0, 1.0], [10.0, 1.0]]
    throttled_reason = "throttled in 50 % of CFS periods"
    assert evidence == [[None, None], [None, throttled_reason], [None, throttled_reason]]
    near = ceilings_at(usage, limit, throttled, [4], 1, 0.9, 0.05)[1]
    assert near == [["usage reached 90 % of the limit", throttled_reason]]


@given(
    st.lists(st.tuples(maybe, maybe, st.lists(maybe, min_size=1, max_size=5), reason), min_size=1, max_size=8),
)
def test_no_line_above_the_ceiling_without_evidence(rows: list[tuple[float, float, list[float], str | None]]) -> None:
    width = max(len(r[2]) for r in rows)
    limit = np.array([r[0] for r in rows])
    highest = np.array([r[1] for r in rows])
    lines = np.array([r[2] + [NAN] * (width - len(r[2])) for r in rows])
    evidence = [r[3] for r in rows]
    ceiling = usage_ceiling(limit, highest)
    held = within_ceiling(lines, ceiling, evidence)
    rules = ceiling_rules({"short_term": lines}, {"short_term": ceiling}, evidence)
    for i, why in enumerate(evidence):
        bound = np.fmax(np.where(limit[i] > 0, limit[i], NAN), highest[i])
        # NaN stays NaN: a missing value is never filled with the ceiling
        assert np.array_equal(np.isnan(held[i]), np.isnan(lines[i]))
        above = bool(np.nanmax(np.r_[lines[i], -np.inf]) > bound) if np.isfinite(bound) else False
        if why is None:
            assert not np.isfinite(bound) or np.all(held[i][~np.isnan(held[i])] <= bound)
            assert rules[i] == ({"short_term": CAPPED} if above else {})
        else:
            # evidence: the line stands as it was, and where it is above, its rule names the evidence
            np.testing.assert_array_equal(held[i], lines[i])
            assert rules[i] == ({"short_term": ABOVE + why} if above else {})
        # a line is only ever lowered, and never below the ceiling
        kept = ~np.isnan(lines[i])
        assert np.all(held[i][kept] <= lines[i][kept])
        if np.isfinite(bound):
            assert np.all(held[i][kept] >= np.minimum(lines[i][kept], bound))


@given(amount, amount, amount, amount, maybe, reason)
def test_monotone_in_the_line_and_in_the_ceiling(
    a: float, b: float, low: float, high: float, limit: float, why: str | None
) -> None:
    low, high = sorted((low, high))
    a, b = sorted((a, b))
    ceilings = usage_ceiling([limit, limit], [low, high])
    # a higher line is never held lower; a higher ceiling never holds a line lower
    smaller, larger = within_ceiling(np.array([a, b]), ceilings[:1].repeat(2), [why, why])
    assert smaller <= larger
    under_low, under_high = within_ceiling(np.array([b, b]), ceilings, [why, why])
    assert under_low <= under_high
    # evidence only ever raises a line
    assert (
        within_ceiling(np.array([b]), ceilings[:1], [None])[0] <= within_ceiling(np.array([b]), ceilings[:1], ["x"])[0]
    )
