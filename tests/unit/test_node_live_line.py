"""The node room from the learned live line: its room rule, the issue that sees no later data, and the
equal-violation comparison of the --nodes backtest."""

from __future__ import annotations

import numpy as np
import pytest

from models.live_line import STEPS_PER_DAY, LiveLineForecaster
from models.nodes import LiveNodeUsage, NodeForecaster, node_live_line
from pipelines.live import NodeLiveLines, with_live_usage
from pipelines.node_backtest import (
    MethodSummary,
    Sweep,
    best_within,
    equal_violations,
    node_live_lines,
)
from recommender import colocation
from recommender.placement import node_reclaimable
from recommender.progress import quiet
from recommender.settings import ColocationSettings, LiveLineSettings
from tests.unit.test_live_line import START, bursty_grid
from tests.unit.test_live_rise import measured_node
from tests.unit.test_nodes import AS_OF, COLOCATION, node_result


def summary(reclaimed: float, violations: int) -> MethodSummary:
    return MethodSummary(
        reclaimed=reclaimed,
        reclaimed_share=0.0,
        violations=violations,
        violation_rate=0.0,
        zero_drops=0,
        mean_change=0.0,
    )


def curve(points: list[tuple[float, float, int]]) -> Sweep:
    """A sweep whose held-out part has these (knob, room, violations)."""
    return [(knob, {"held_out": summary(room, violations)}) for knob, room, violations in points]


def test_line_room_reserves_the_larger_of_level_plus_rise_and_the_line() -> None:
    alloc = np.full((1, 5), 100.0)
    last = np.array([[40.0, 40.0, 40.0, np.nan, 40.0]])
    line = np.array([[50.0, 30.0, np.nan, 50.0, 42.0]])
    rise = np.array([[5.0, 5.0, 5.0, 5.0, -3.0]])
    room = colocation.line_reclaimable(alloc, 5.0, 0.0, 0.0, last, rise, line)
    # 100 - 5 - max(40 + 5, 50); - max(45, 30); no line: the rise tables' room; no measurement: the caller's value;
    # never below the measurement itself (a negative rise), the line above it counts
    np.testing.assert_array_equal(room[:, [0, 1, 2, 4]], [[45.0, 50.0, 50.0, 53.0]])
    assert np.isnan(room[0, 3])
    no_line = colocation.live_reclaimable(alloc, 5.0, 0.0, 0.0, last, rise, np.nan)
    np.testing.assert_array_equal(room[:, 2], no_line[:, 2])
    assert colocation.line_reclaimable(10.0, 0.0, 0.0, 0.0, 4.0, 1.0, 30.0) == 0.0  # floored at 0


def test_room_at_a_budget_is_the_best_point_within_it_and_never_shrinks_with_the_budget() -> None:
    swept = curve([(1.0, 100.0, 9), (1.2, 80.0, 4), (1.4, 85.0, 2), (1.6, 60.0, 0)])
    assert best_within(swept, "held_out", 0) == (1.6, swept[3][1]["held_out"])
    # 85 with 2 violations beats 80 with 4: the curve is the best point within the budget, not the nearest knob
    assert best_within(swept, "held_out", 5) == (1.4, swept[2][1]["held_out"])
    assert best_within(swept, "held_out", 9) == (1.0, swept[0][1]["held_out"])
    assert best_within(curve([(1.0, 10.0, 3)]), "held_out", 2) is None
    rooms = [point[1].reclaimed for b in range(12) if (point := best_within(swept, "held_out", b)) is not None]
    assert rooms == sorted(rooms) and len(rooms) == 12


def named(factor: float) -> str:
    return f"factor {factor:g}"


def test_equal_violations_by_hand() -> None:
    """Ours as served at 3 violations in 2,000 node-steps; Koordinator's thresholds swept."""
    ours = curve([(0.8, 150.0, 40), (1.0, 120.0, 3), (1.2, 110.0, 1)])
    koordinator = curve([(80.0, 130.0, 30), (70.0, 100.0, 5), (65.0, 90.0, 2), (60.0, 75.0, 0)])
    found = equal_violations(ours, (1.0, ours[1][1]["held_out"]), koordinator, "held_out", 2000, named)
    assert found.served == "factor 1" and found.node_steps == 2000
    at_count, tight, loose = found.at["ours"], found.at["0.1 %"], found.at["1 %"]
    assert at_count.budget == 3 and at_count.koordinator is not None and at_count.koordinator[0] == "threshold 65 %"
    assert at_count.gain == pytest.approx(120 / 90 - 1)
    assert tight.budget == 2 and tight.ours is not None and tight.ours[0] == "factor 1.2"
    assert tight.gain == pytest.approx(110 / 90 - 1)
    assert loose.budget == 20 and loose.gain == pytest.approx(120 / 100 - 1)  # 0.8's 40 are over 20
    assert (
        equal_violations(ours, (1.0, ours[1][1]["held_out"]), curve([(60.0, 75.0, 9)]), "held_out", 0, named)
        .at["ours"]
        .gain
        is None
    )  # Koordinator has no point as safe


def test_the_node_line_issued_before_a_cut_sees_nothing_after_it() -> None:
    """Every sample from a cut onwards changed: each line issued before the cut is unchanged (no peeking), and lines
    after it move."""
    grid = bursty_grid(rows=6, days=12, seed=4)
    measured = np.ones(grid.shape, dtype=bool)
    start, end = 8 * STEPS_PER_DAY, 10 * STEPS_PER_DAY
    model = LiveLineForecaster(target_violation=0.01, horizon_seconds=300, training_days=6)
    before = node_live_lines(grid, measured, START, start, end, model, quiet)
    cut = start + STEPS_PER_DAY + 37
    changed = grid.copy()
    changed[:, cut:] *= 3.0
    after = node_live_lines(changed, measured, START, start, end, model, quiet)
    assert before.shape == (6, end - start) and np.isfinite(before).mean() > 0.9
    np.testing.assert_array_equal(before[:, : cut - start + 1], after[:, : cut - start + 1])
    assert not np.allclose(before[:, cut - start + 2 :], after[:, cut - start + 2 :], equal_nan=True)


def test_the_node_line_sees_only_what_was_measured() -> None:
    """A node without a measurement for over an hour gets no line (the rise tables' room serves it); the others keep
    theirs."""
    grid = bursty_grid(rows=4, days=10, seed=5)
    measured = np.ones(grid.shape, dtype=bool)
    start = 8 * STEPS_PER_DAY
    measured[0, start + 100 : start + 130] = False
    model = LiveLineForecaster(target_violation=0.01, horizon_seconds=300, training_days=6)
    lines = node_live_lines(grid, measured, START, start, start + 200, model, quiet)
    assert np.isnan(lines[0, 113:131]).all() and np.isfinite(lines[0, :100]).all()
    assert np.isfinite(lines[1:, 100:131]).all()


def test_the_node_line_takes_the_node_rooms_level_and_horizon() -> None:
    colocation_settings = ColocationSettings(live_line_target_violation=0.002, live_line_horizon_seconds=600)
    model = node_live_line(LiveLineSettings(training_days=9), colocation_settings, 300)
    assert (model.target_violation, model.horizon_seconds, model.training_days) == (0.002, 600, 9)


def test_the_line_knobs_are_chosen_by_the_validation_gain_at_equal_violations() -> None:
    """Koordinator's curve: 100 at 0 violations, 140 at 5; ours: (0.5, 5 %) 130 at 0 (+30 %), (0.5, 2 %) 170 at 5
    (+21 %), (0.8, 5 %) 130 at 2 (+30 %, more violations: loses the tie). Held-out figures play no part."""

    def part(room: float, violations: int, held_out: int = 0) -> dict[str, MethodSummary]:
        return {"validation": summary(room, violations), "held_out": summary(1e9, held_out)}

    result = node_result(
        line_sweeps={
            "cpu": [((0.5, 0.05), part(130.0, 0)), ((0.5, 0.02), part(170.0, 5)), ((0.8, 0.05), part(130.0, 2))]
        },
        koordinator_sweeps={"cpu": [(70.0, part(140.0, 5)), (60.0, part(100.0, 0))]},
    )
    assert result.chosen_line_knobs("cpu") == (0.5, 0.05)
    result.koordinator_sweeps["cpu"] = [(70.0, part(140.0, 5))]  # nothing of Koordinator's at 0 or 2 violations
    assert result.chosen_line_knobs("cpu") == (0.5, 0.02)


def grid_model(grid: np.ndarray, end: int) -> NodeForecaster:
    """A node model as training leaves it: two nodes' pooled grids ending at `end` and a fitted node live line."""
    model = NodeForecaster(live_line=LiveLineForecaster(target_violation=0.05, training_days=6))
    model.nodes_ = np.array(["a", "b"])
    model.grid_end_ = end
    model.cpu_grid_, model.memory_grid_ = grid, grid * 1e9
    model.cpu_live_line_ = model._fit_live_line(grid)
    model.memory_live_line_ = model._fit_live_line(grid * 1e9)
    return model


def test_the_live_loop_issues_the_node_line_from_the_version_grid_and_its_measurements() -> None:
    grid = bursty_grid(rows=2, days=8, seed=6)
    end = START + grid.shape[1] * 300
    model = grid_model(grid, end)
    assert model.fitted_live_line("cpu") is not None
    lines = NodeLiveLines(model)
    lines.add({"a": LiveNodeUsage(end, 50.0, 50e9)})  # a spike in the step after the version's end
    issued = lines.issue()
    cpu = model.fitted_live_line("cpu")
    assert cpu is not None
    extended = np.concatenate([grid[:, 1:], [[50.0], [np.nan]]], axis=1)  # slid one step, node b unmeasured
    expected = cpu.predict(extended, issued_at=end + 300)
    assert issued["a"]["cpu"] == pytest.approx(expected[0]) and issued["b"]["cpu"] == pytest.approx(expected[1])
    assert issued["a"]["cpu"] > NodeLiveLines(model).issue()["a"]["cpu"]  # the measurement counts
    # Measured far above its line for the next step: the online calibration raises the next issue's factor.
    before = lines.scales["cpu"].fleet
    lines.add({"a": LiveNodeUsage(end + 300, 1e3, 1e12), "b": LiveNodeUsage(end + 300, 1e3, 1e12)})
    lines.issue()
    assert lines.scales["cpu"].fleet > before
    # The next version's lines start from this calibration, not from factor 1 (a node model at another level does not).
    assert NodeLiveLines(model).continued_from(lines).scales["cpu"].fleet == lines.scales["cpu"].fleet
    assert NodeLiveLines(model).scales["cpu"].fleet == 0.0
    other = grid_model(grid, end)
    other.cpu_live_line_ = LiveLineForecaster(target_violation=0.01, training_days=6).fit(grid, grid_end=end)
    assert NodeLiveLines(other).continued_from(lines).scales["cpu"].fleet == 0.0
    # A node not measured for over an hour gets no line (the rise tables serve it); a measured one keeps its own.
    lines.add({"a": LiveNodeUsage(end + 300 * 20, 2.0, 2e9)})
    assert set(lines.issue()) == {"a"}
    assert NodeLiveLines(None).issue() == {} and NodeLiveLines(NodeForecaster()).issue() == {}


def test_the_served_batch_reserves_the_larger_of_the_rise_and_the_issued_line() -> None:
    loads, lines = measured_node([0.5] * 100)
    forecast = loads.states["a"].forecast
    assert forecast is not None
    margin = 10.0 * COLOCATION.cpu_live_line_margin_fraction
    factor = COLOCATION.cpu_live_line_factor
    for line, reserved in ((9.0 / factor, 9.0), (7.2 / factor, 7.5)):
        lines.live_line = line
        found = node_reclaimable(loads, "a", "cpu", AS_OF + 60, COLOCATION)
        assert found is not None and found.batch == pytest.approx(10.0 - margin - reserved)
    off = node_reclaimable(loads, "a", "cpu", AS_OF + 60, COLOCATION.model_copy(update={"live_line": False}))
    assert off is not None and off.batch == pytest.approx(10.0 - 10.0 * COLOCATION.cpu_live_margin_fraction - 7.5)
    updated = with_live_usage([forecast], {"a": LiveNodeUsage(AS_OF + 30, 7.0, 1.0)}, None, {"a": {"cpu": 3.0}})
    assert updated[0].cpu is not None and updated[0].cpu.live_line == 3.0
    assert updated[0].memory is None or updated[0].memory.live_line is None


def test_the_node_line_keeps_the_fleet_factor_alone_while_containers_get_their_own() -> None:
    """The containers' live line has a slow factor per container (`own_adaptation_rate`, issue 38); a node's room
    knobs were chosen with the fleet's factor alone, so the node line does not take it from the shared settings."""
    settings = LiveLineSettings()
    containers = LiveLineForecaster.from_settings(settings, 0.05)
    nodes = node_live_line(settings, ColocationSettings(), 300)
    assert containers.own_adaptation_rate > 0 and nodes.own_adaptation_rate == nodes.own_sink_rate == 0.0
    assert nodes.fleet_adaptation_rate == ColocationSettings().live_line_fleet_adaptation_rate
    assert nodes.fleet_adaptation_rate != containers.fleet_adaptation_rate
    state = nodes.initial_scale().updated(np.ones(2), np.array([[2.0] * 12, [0.5] * 12]))
    assert state.factors(2)[0] == state.factors(2)[1]  # one node missed every step, the other none: one factor
