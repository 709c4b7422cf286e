"""The live node room's rise table (issue 18): Mondrian by node and level band, learned with no look-ahead."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from models.nodes import NodeForecaster, level_rise_table, live_rise_reference
from models.workload import FleetForecaster
from pipelines.node_backtest import live_rise_tables
from recommender import colocation as c
from recommender.placement import live_rise, node_reclaimable
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


def test_the_model_stores_each_nodes_table_and_the_served_room_reads_it() -> None:
    found = {n.node: n for n in NodeForecaster(FleetForecaster.from_settings(FAST)).fit(alternating()).predict()}
    cpu = found["a"].cpu
    assert cpu is not None and cpu.live_rise is not None and len(cpu.live_rise) == c.LEVEL_BINS
    assert cpu.live_rise_reference == 4.0  # the high-priority requests (the batch pod borrows)
    # the pods swap at 00:00 and 12:00: the pooled usage stays at 4.5, so no step rises
    assert max(cpu.live_rise) == pytest.approx(0.0, abs=1e-9)
    lines = NodeResourceLines(
        limit=10.0,
        last_usage=1.0,
        jump=0.1,
        largest_jump=6.0,
        recent_usage=[],
        short_term=[],
        long_term=1.0,
        live_rise=[6.0] * 30 + [1.0] * 70,
        live_rise_reference=10.0,
    )
    assert live_rise(lines, 1.0) == 6.0 and live_rise(lines, 8.0) == 1.0
    assert live_rise(lines.model_copy(update={"live_rise": None}), 8.0) == 6.0  # older versions: the week's largest


def test_the_served_live_room_is_the_level_plus_the_tables_rise() -> None:
    loads = view(AS_OF)
    forecast = loads.states["a"].forecast
    assert forecast is not None and forecast.cpu is not None
    forecast.live_sample = AS_OF + 30
    forecast.cpu.live_usage = 7.0
    forecast.cpu.live_rise = [3.0] * 50 + [0.5] * 50  # from 7 of 10 cores only half a core more
    forecast.cpu.live_rise_reference = 10.0
    found = node_reclaimable(loads, "a", "cpu", AS_OF + 60, COLOCATION)
    assert found is not None and found.policy == "live"
    margin = 10.0 * COLOCATION.cpu_live_margin_fraction
    assert found.batch == pytest.approx(10.0 - margin - 7.5)


def test_a_model_pickled_before_the_table_gets_its_defaults() -> None:
    model = NodeForecaster(FleetForecaster.from_settings(FAST)).fit(alternating())
    state = model.__getstate__()
    for name in ("live_rise_band_fraction", "cpu_live_rise_history_days", "memory_live_rise_history_days"):
        del state[name]
    old = NodeForecaster.__new__(NodeForecaster)
    old.__setstate__(state)
    restored = pickle.loads(pickle.dumps(old))
    assert restored.get_params()["live_rise_band_fraction"] == ColocationSettings().live_rise_band_fraction
    assert restored.predict()[0].cpu is not None


def test_the_reference_is_the_requests_else_the_peak() -> None:
    assert live_rise_reference(np.array([[1.0, 3.0]]), 8.0) == 8.0
    assert live_rise_reference(np.array([[1.0, 3.0]]), None) == 3.0
    assert live_rise_reference(np.array([[1.0, 3.0]]), float("nan")) == 3.0
    assert live_rise_reference(np.array([[np.nan]]), None) == 1.0
