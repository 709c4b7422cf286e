"""The live node room's rise table (issue 18): Mondrian by node and level band, learned with no look-ahead."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from models.nodes import (
    LiveNodeUsage,
    NodeForecaster,
    activity_rise_tables,
    level_rise_table,
    live_rise_reference,
    measured_activity,
    measured_climb,
    node_activity,
)
from models.workload import FleetForecaster
from pipelines.live import NodeActivity, with_live_usage
from pipelines.node_backtest import climbs, live_rise_tables
from recommender import colocation as c
from recommender.placement import NodeLoads, live_rise, node_reclaimable
from recommender.resources import NodeResourceLines
from recommender.settings import ColocationSettings
from tests.unit.test_nodes import AS_OF, COLOCATION, FAST, alternating, view

usage_rows = arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(2, 40)), elements=st.floats(0, 10))


def test_a_level_bin_is_one_percent_of_the_reference() -> None:
    assert c.level_bin(0.0, 10.0) == 0 and c.level_bin(0.1, 10.0) == 1 and c.level_bin(9.99, 10.0) == 99
    assert c.level_bin(25.0, 10.0) == 99  # above the reference: the last bin
    assert c.level_bin(float("nan"), 10.0) == 0 and c.level_bin(3.0, 0.0) == 0
    table = np.arange(c.LEVEL_BINS, dtype=float)[None, :]
    np.testing.assert_allclose(c.level_rise(table, np.array([[0.55, 5.0]]), np.array([10.0])), [[5.0, 50.0]])


def test_the_rise_kept_is_the_largest_from_a_similar_level() -> None:
    # from 1 core the node jumped to 5 (a burst from idle); from 8 it rose only to 9; reference 10 cores
    grid = np.array([[1.0, 5.0, 1.0, 8.0, 9.0, 8.0]])
    table = level_rise_table(grid, np.array([10.0]), 0.1, 10)
    rise = c.level_rise(table, np.array([[1.0, 8.0, 5.0, 3.2]]), np.array([10.0]))[0]
    # within 1 core of 1: the bursts (4, and 7 from 1 to 8); of 8: 1 (and the 1-core fall from 9); from 5 the node
    # only fell: 0; no step started within 1 core of 3.2: the node's largest rise
    np.testing.assert_allclose(rise, [7.0, 1.0, 0.0, 7.0])
    # band 1: every level keeps the largest rise (the earlier form); no rise known: 0
    np.testing.assert_allclose(level_rise_table(grid, np.array([10.0]), 1.0, 10), 7.0)
    np.testing.assert_allclose(level_rise_table(np.array([[3.0, 2.0, np.nan]]), np.array([10.0]), 0.2, 10), 0.0)
    # only the last `steps` rises count
    np.testing.assert_allclose(level_rise_table(grid, np.array([10.0]), 1.0, 2), 1.0)


@settings(max_examples=60, deadline=None)
@given(usage_rows, st.floats(0, 1), st.floats(0, 1))
def test_the_table_is_bounded_and_monotone_in_the_band(grid: np.ndarray, narrow: float, wide: float) -> None:
    narrow, wide = min(narrow, wide), max(narrow, wide)
    reference = np.full(grid.shape[0], 10.0)
    small = level_rise_table(grid, reference, narrow, grid.shape[1])
    large = level_rise_table(grid, reference, wide, grid.shape[1])
    largest = np.maximum(np.diff(grid, axis=1).max(axis=1), 0.0)
    assert np.all(small >= 0) and np.all(large <= largest[:, None] + 1e-12)
    # a wider band reserves at least as much wherever the narrow one saw a step (below the largest rise, which a bin
    # with no step near it falls back to)
    seen = small < largest[:, None] - 1e-12
    assert np.all(large[seen] >= small[seen] - 1e-12)


@settings(max_examples=40, deadline=None)
@given(usage_rows, st.integers(1, 38), st.floats(0, 50))
def test_no_look_ahead_a_change_after_the_decision_leaves_its_table(
    grid: np.ndarray, decision: int, changed: float
) -> None:
    """The backtest's tables, as the daily training learns them: a value after a decision day's start changes no
    table of that day or earlier."""
    per_day = 2
    days = list(range(1, grid.shape[1] // per_day + 1))
    requested = np.full(grid.shape, 10.0)
    before = live_rise_tables(grid, requested, days, per_day, 0.2, COLOCATION.of("cpu"))
    after_grid = grid.copy()
    after_grid[:, decision:] = changed
    after = live_rise_tables(after_grid, requested, days, per_day, 0.2, COLOCATION.of("cpu"))
    for day, table, other in zip(days, before.tables, after.tables):
        if day * per_day <= decision:
            np.testing.assert_array_equal(table, other)


@settings(max_examples=60, deadline=None)
@given(st.floats(0, 20), st.floats(0, 5), st.floats(0, 5), st.floats(0, 0.5), st.floats(0, 0.5))
def test_the_live_room_shrinks_as_the_rise_or_margin_grows(
    level: float, rise: float, more: float, margin: float, extra: float
) -> None:
    room = float(c.live_reclaimable(32.0, 32.0 * margin, 0.0, 0.0, level, rise, float("nan")))
    assert float(c.live_reclaimable(32.0, 32.0 * margin, 0.0, 0.0, level, rise + more, float("nan"))) <= room + 1e-9
    assert float(c.live_reclaimable(32.0, 32.0 * (margin + extra), 0.0, 0.0, level, rise, float("nan"))) <= room + 1e-9


def pooled(**tables: Any) -> NodeResourceLines:
    """A node's pooled lines of 10 cores' requests with these rise tables (the week's largest rise: 6)."""
    return NodeResourceLines(
        limit=10.0,
        last_usage=1.0,
        jump=0.1,
        largest_jump=6.0,
        recent_usage=[],
        short_term=[],
        long_term=1.0,
        live_rise_reference=10.0,
        **tables,
    )


def test_the_model_stores_each_nodes_table_and_the_served_room_reads_it() -> None:
    found = {n.node: n for n in NodeForecaster(FleetForecaster.from_settings(FAST)).fit(alternating()).predict()}
    cpu = found["a"].cpu
    assert cpu is not None and cpu.live_rise is not None and len(cpu.live_rise) == c.LEVEL_BINS
    assert cpu.live_rise_reference == 4.0  # the high-priority requests (the batch pod borrows)
    # the pods swap at 00:00 and 12:00: the pooled usage stays at 4.5, so no step rises
    assert max(cpu.live_rise) == pytest.approx(0.0, abs=1e-9)
    lines = pooled(live_rise=[6.0] * 30 + [1.0] * 70)
    assert live_rise(lines, 1.0) == 6.0 and live_rise(lines, 8.0) == 1.0
    assert live_rise(lines.model_copy(update={"live_rise": None}), 8.0) == 6.0  # older versions: the week's largest


def measured_node(live_rise: list[float]) -> tuple[NodeLoads, NodeResourceLines]:
    """Node "a" of the test view measured by the live loop at 7 of its 10 cores, with this rise table; and its CPU
    lines, for a test to set more on."""
    loads = view(AS_OF)
    forecast = loads.states["a"].forecast
    assert forecast is not None and forecast.cpu is not None
    forecast.live_sample = AS_OF + 30
    forecast.cpu.live_usage = 7.0
    forecast.cpu.live_rise = live_rise
    forecast.cpu.live_rise_reference = 10.0
    return loads, forecast.cpu


def test_the_served_live_room_is_the_level_plus_the_tables_rise() -> None:
    loads, _ = measured_node([3.0] * 50 + [0.5] * 50)  # from 7 of 10 cores only half a core more
    found = node_reclaimable(loads, "a", "cpu", AS_OF + 60, COLOCATION)
    assert found is not None and found.policy == "live"
    margin = 10.0 * COLOCATION.cpu_live_margin_fraction
    assert found.batch == pytest.approx(10.0 - margin - 7.5)


def test_a_model_pickled_before_the_table_gets_its_defaults() -> None:
    model = NodeForecaster(FleetForecaster.from_settings(FAST)).fit(alternating())
    state = model.__getstate__()
    for name in (
        "live_rise_band_fraction",
        "cpu_live_rise_history_days",
        "memory_live_rise_history_days",
        "live_rise_activity_seconds",
    ):
        del state[name]
    old = NodeForecaster.__new__(NodeForecaster)
    old.__setstate__(state)
    restored = pickle.loads(pickle.dumps(old))
    assert restored.get_params()["live_rise_band_fraction"] == ColocationSettings().live_rise_band_fraction
    assert restored.get_params()["live_rise_activity_seconds"] == ColocationSettings().live_rise_activity_seconds
    assert restored.predict()[0].cpu is not None


def test_the_reference_is_the_requests_else_the_peak() -> None:
    assert live_rise_reference(np.array([[1.0, 3.0]]), 8.0) == 8.0
    assert live_rise_reference(np.array([[1.0, 3.0]]), None) == 3.0
    assert live_rise_reference(np.array([[1.0, 3.0]]), float("nan")) == 3.0
    assert live_rise_reference(np.array([[np.nan]]), None) == 1.0


def test_activity_is_the_largest_change_of_the_last_steps_up_to_each_step() -> None:
    grid = np.array([[1.0, 1.0, 4.0, 4.0, 4.0, 3.0, np.nan, 3.0]])
    np.testing.assert_allclose(node_activity(grid, 2)[0], [np.nan, 0, 3, 3, 0, 1, 1, np.nan])
    np.testing.assert_allclose(node_activity(grid, 1)[0], [np.nan, 0, 3, 0, 0, 1, np.nan, np.nan])


def calm_then_bursts(days: int = 6, per_day: int = 48) -> np.ndarray:
    """A node idling at 1 core that, once busy (a 1-core step), climbs 3 cores more; never more than 1 from calm."""
    day = np.ones(per_day)
    day[20:30] = [2.0, 5.0, 5.0, 5.0, 2.0, 5.0, 5.0, 1.0, 1.0, 1.0]
    return np.tile(day, days)[None, :]


def test_a_calm_node_keeps_a_calm_nodes_rises_and_an_active_one_a_bursts() -> None:
    grid = calm_then_bursts()
    reference = np.array([10.0])
    whole = level_rise_table(grid, reference, 0.2, grid.shape[1] - 1)
    calm, active, edge = activity_rise_tables(grid, reference, 0.2, grid.shape[1] - 1, 3, whole)
    at_one = c.level_bin(1.0, 10.0)
    # From about 1 core (the band: 1 +- 2): after calm the node rose by 1 (into its first busy step), after a
    # change by 3 (from 2 to 5). Idle most of the time, its median activity is 0: calm is no change at all.
    assert calm[0, at_one] == pytest.approx(1.0) and active[0, at_one] == pytest.approx(3.0)
    assert whole[0, at_one] == pytest.approx(3.0) and np.all(calm <= whole + 1e-12) and np.all(active <= whole + 1e-12)
    assert edge[0] == 0.0
    # the backtest's tables read the calm one after calm, the active one after activity, the whole one unknown
    tables = live_rise_tables(grid, np.full(grid.shape, 10.0), [3, 4], 48, 0.2, COLOCATION.of("cpu"), 3)
    level = np.ones((1, 96))
    activity = np.full((1, 96), np.nan)
    activity[0, :48], activity[0, 48:60] = 0.0, 4.0
    rise = tables.rise(level, activity)[0]
    assert rise[0] == pytest.approx(1.0) and rise[50] == pytest.approx(3.0) and rise[70] == pytest.approx(3.0)


@settings(max_examples=40, deadline=None)
@given(usage_rows, st.integers(1, 6))
def test_the_split_tables_stay_within_the_whole_one(grid: np.ndarray, steps: int) -> None:
    reference = np.full(grid.shape[0], 10.0)
    whole = level_rise_table(grid, reference, 0.2, grid.shape[1])
    calm, active, _ = activity_rise_tables(grid, reference, 0.2, grid.shape[1], steps, whole)
    assert np.all(calm >= 0) and np.all(active >= 0)
    assert np.all(calm <= whole + 1e-12) and np.all(active <= whole + 1e-12)


def test_measured_activity_needs_the_window_covered_and_pairs_a_step_apart() -> None:
    history = {0: 1.0, 300: 1.0, 600: 3.0, 900: 2.5, 960: 9.0}
    assert measured_activity(history, 900, 900, 300) == pytest.approx(2.0)  # 300->600; 960 is after the newest
    assert measured_activity(history, 900, 1200, 300) is None  # the window starts before the first measurement
    assert measured_activity({900: 1.0}, 900, 300, 300) is None  # no pair a step apart
    assert measured_activity({}, 900, 300, 300) is None


def test_the_live_loop_measures_each_nodes_activity_and_publishes_it_with_the_usage() -> None:
    activity = NodeActivity(window_seconds=900, step_seconds=300)
    for sample, cpu in ((0, 1.0), (300, 1.0), (600, 1.5), (900, 1.5)):
        activity.add({"a": LiveNodeUsage(sample, cpu, 2.0)})
    newest = {"a": LiveNodeUsage(900, 1.5, 2.0)}
    assert activity.of(newest) == {"a": {"cpu": pytest.approx(0.5), "memory": pytest.approx(0.0)}}
    activity.add({"a": LiveNodeUsage(5000, 1.0, 2.0)})  # a long gap: what is older than the window is let go
    assert activity.of({"a": LiveNodeUsage(5000, 1.0, 2.0)}) == {"a": {"cpu": None, "memory": None}}
    assert NodeActivity(0, 300).of(newest) == {}
    nodes = NodeForecaster(FleetForecaster.from_settings(FAST)).fit(alternating()).predict()
    updated = {n.node: n for n in with_live_usage(nodes, {"a": newest["a"]}, {"a": {"cpu": 0.5, "memory": None}})}
    cpu = updated["a"].cpu
    assert cpu is not None and cpu.live_usage == 1.5 and cpu.live_activity == 0.5
    assert cpu.live_rise_calm is not None and cpu.live_rise_active is not None


def test_the_served_rise_is_the_calm_or_the_active_tables_by_the_measured_activity() -> None:
    lines = pooled(
        live_rise=[6.0] * 100, live_rise_calm=[1.0] * 100, live_rise_active=[5.0] * 100, live_activity_edge=0.5
    )
    assert live_rise(lines, 1.0) == 6.0  # activity not measured: the whole table
    assert live_rise(lines.model_copy(update={"live_activity": 0.5}), 1.0) == 1.0
    assert live_rise(lines.model_copy(update={"live_activity": 0.6}), 1.0) == 5.0
    assert live_rise(lines.model_copy(update={"live_activity": 0.2, "live_rise_calm": None}), 1.0) == 6.0


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float64, 6, elements=st.floats(0, 100)),
    arrays(np.float64, 6, elements=st.floats(-50, 50) | st.just(float("nan"))),
    st.floats(0, 5),
)
def test_the_climb_adds_its_factor_times_a_rise_into_the_level_and_nothing_for_a_fall(
    rise: np.ndarray, climb: np.ndarray, factor: float
) -> None:
    found = c.climbing_rise(rise, climb, factor)
    rising = np.nan_to_num(climb) > 0
    np.testing.assert_allclose(found[~rising], rise[~rising])  # a fall, no change or unknown: the table's rise
    np.testing.assert_allclose(found[rising], rise[rising] + factor * climb[rising])
    np.testing.assert_allclose(c.climbing_rise(rise, climb, 0.0), rise)  # factor 0: off


def test_the_climb_is_the_change_into_the_newest_measurement_from_one_a_step_before() -> None:
    history = {0: 1.0, 300: 1.5, 600: 4.0, 960: 2.0}
    assert measured_climb(history, 600, 300) == pytest.approx(2.5)
    assert measured_climb(history, 300, 300) == pytest.approx(0.5)
    assert measured_climb(history, 960, 300) is None  # no measurement a step before
    assert measured_climb(history, 900, 300) is None  # not measured then
    # the backtest's climbs: the same, NaN unless both steps were measured
    values = np.array([[1.0, 1.5, 4.0, 2.0, 3.0]])
    measured = np.array([[True, True, True, False, True]])
    np.testing.assert_allclose(climbs(values, measured), [[np.nan, 0.5, 2.5, np.nan, np.nan]])


def test_the_live_loop_publishes_each_nodes_climb_and_the_served_room_keeps_its_factor_of_it() -> None:
    activity = NodeActivity(window_seconds=0, step_seconds=300)  # the climb needs no activity window
    for sample, cpu in ((0, 1.0), (300, 3.0)):
        activity.add({"a": LiveNodeUsage(sample, cpu, 2.0)})
    newest = {"a": LiveNodeUsage(300, 3.0, 2.0)}
    assert activity.climbs(newest) == {"a": {"cpu": pytest.approx(2.0), "memory": pytest.approx(0.0)}}
    nodes = NodeForecaster(FleetForecaster.from_settings(FAST)).fit(alternating()).predict()
    updated = {n.node: n for n in with_live_usage(nodes, newest, climbs=activity.climbs(newest))}
    cpu = updated["a"].cpu
    assert cpu is not None and cpu.live_climb == pytest.approx(2.0)

    loads, lines = measured_node([0.5] * 100)
    lines.live_climb = 1.0  # the node rose by a core into 7
    climbing = COLOCATION.model_copy(update={"cpu_live_climb_factor": 1.5, "live_line": False})
    margin = 10.0 * COLOCATION.cpu_live_margin_fraction
    found = node_reclaimable(loads, "a", "cpu", AS_OF + 60, climbing)
    assert found is not None and found.batch == pytest.approx(10.0 - margin - 7.0 - 0.5 - 1.5)
    lines.live_climb = -1.0  # a fall keeps the table's rise alone
    found = node_reclaimable(loads, "a", "cpu", AS_OF + 60, climbing)
    assert found is not None and found.batch == pytest.approx(10.0 - margin - 7.5)


def test_memory_keeps_a_climb_and_a_smaller_flat_margin_by_default() -> None:
    defaults = ColocationSettings()
    assert defaults.memory_live_climb_factor == 2.25 and defaults.cpu_live_climb_factor == 0.0
    assert defaults.memory_live_line_margin_fraction == defaults.memory_live_margin_fraction == 0.075
