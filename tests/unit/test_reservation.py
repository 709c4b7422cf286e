"""Reservation lines: Koordinator's mid rule and the seasonal short-term line on series with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from sklearn.exceptions import NotFittedError

from models.histogram import ExponentialBuckets
from models.reservation import PercentileReservation, SeasonalMaxReservation, peak_of

DAY = 86400
STEP = 300


def series(values: np.ndarray, start: int = 0, group: str = "g") -> pd.DataFrame:
    return pd.DataFrame({"group": group, "timestamp": start + STEP * np.arange(values.size), "value": values})


def test_long_term_is_percentile_times_margin() -> None:
    values = np.linspace(0.01, 2.0, 1000)
    model = PercentileReservation(percentile=0.95, margin_fraction=0.10, half_life_seconds=1e12).fit(series(values))
    buckets = ExponentialBuckets(0.01, 1000.0, 0.05)
    p95 = buckets.starts[buckets.find(np.array([np.quantile(values, 0.95)]))[0] + 1]
    assert model.predict()[0] == pytest.approx(p95 * 1.10, rel=0.06)
    assert model.predict(["g"])[0] == model.predict()[0]
    with pytest.raises(KeyError):
        model.predict(["nope"])


def test_short_term_follows_a_daily_cycle() -> None:
    t = np.arange(0, 7 * DAY, STEP)
    values = 1.0 + np.sin(2 * np.pi * t / DAY)
    model = SeasonalMaxReservation(recent_window_seconds=STEP, slot_tolerance_seconds=0).fit(series(values))
    line = model.predict(as_of=7 * DAY, horizon_seconds=DAY)[0]
    expected = 1.0 + np.sin(2 * np.pi * np.arange(0, DAY, STEP) / DAY)
    # Each step is the same slot a day earlier; only the first step can be lifted by the last sample.
    np.testing.assert_allclose(line[1:], expected[1:], atol=1e-9)
    assert line.shape == (288,)


def test_short_term_tolerates_timing_jitter() -> None:
    t = np.arange(0, 3 * DAY, STEP)
    values = np.where((t % DAY) == 12 * 3600 + 600, 5.0, 1.0)  # a spike at 12:10 every day
    model = SeasonalMaxReservation(slot_tolerance_seconds=900).fit(series(values))
    line = model.predict(as_of=3 * DAY, horizon_seconds=DAY)[0]
    noon = 12 * 3600 // STEP
    assert line[noon] == 5.0  # 12:00 is within 15 minutes of the spike
    assert line[noon - 6] == 1.0  # 11:30 is not


def test_short_term_lifts_within_an_hour_of_a_step_up() -> None:
    t = np.arange(0, 3 * DAY, STEP)
    values = np.where(t >= 3 * DAY - 1800, 4.0, 1.0)  # usage quadrupled in the last 30 minutes
    line = SeasonalMaxReservation().fit(series(values)).predict(as_of=3 * DAY, horizon_seconds=DAY)[0]
    assert line.min() >= 4.0


def test_stopped_workload_keeps_its_recent_size() -> None:
    old = series(np.full(288, 2.0), start=0, group="old")
    live = series(np.full(288 * 10, 1.0), start=0, group="live")
    model = SeasonalMaxReservation().fit(pd.concat([old, live]))
    lines = model.predict(as_of=10 * DAY, horizon_seconds=DAY)
    assert lines[list(model.groups_).index("old")].min() == 2.0
    assert lines[list(model.groups_).index("live")].max() == 1.0


def test_recent_usage_window_and_peak() -> None:
    values = np.arange(288 * 2, dtype=float)
    model = SeasonalMaxReservation().fit(series(values))
    recent = model.recent(as_of=2 * DAY, window_seconds=3600)[0]
    np.testing.assert_array_equal(recent, values[-12:])
    value, at = peak_of(np.array([[1.0, 3.0, 2.0]]), as_of=1000, step_seconds=STEP)
    assert value[0] == 3.0 and at[0] == 1300


def test_a_flat_or_falling_line_has_no_peak_time() -> None:
    """Issue 39: every peak fell at the decision time (a flat line's highest step is its first). A line highest at
    its first step, or at its highest to the horizon's end, has no time of maximum: NaN (null in the JSON)."""
    lines = np.array([[2.0, 2.0, 2.0], [3.0, 1.0, 1.0], [1.0, 2.0, 2.0], [1.0, 2.0, 3.0], [1.0, 3.0, 3.0]])
    value, at = peak_of(lines, as_of=1000, step_seconds=STEP)
    np.testing.assert_array_equal(value, [2.0, 3.0, 2.0, 3.0, 3.0])
    assert np.isnan(at).all()
    value, at = peak_of(np.array([[1.0, 3.0, 3.0, 1.0]]), as_of=1000, step_seconds=STEP)
    assert value[0] == 3.0 and at[0] == 1000 + STEP


@given(arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 30)), elements=st.sampled_from([0.5, 1.0, 2.0])))
def test_the_peak_time_is_after_the_decision_time_at_the_lines_highest(lines: np.ndarray) -> None:
    """The peak time, where there is one, lies strictly after the decision time and within the horizon, at a step
    where the line is at its highest and after which it falls again; the value is the line's highest."""
    as_of = 10_000
    value, at = peak_of(lines, as_of, STEP)
    np.testing.assert_array_equal(value, lines.max(axis=1))
    for row, time in zip(lines, at.tolist()):
        if np.isnan(time):
            first = int(np.argmax(row))
            assert first == 0 or (row[first:] == row.max()).all()
            continue
        step = (time - as_of) / STEP
        assert step == int(step) and 0 < step < row.size
        assert row[int(step)] == row.max() and (row[: int(step)] < row.max()).all()
        assert (row[int(step) :] < row.max()).any()


def test_predict_before_fit_raises() -> None:
    with pytest.raises(NotFittedError):
        SeasonalMaxReservation().predict(0)


def test_the_grid_keeps_only_observed_cells_and_a_dense_one_pickled_before_loads_as_them() -> None:
    """Issue 41: a group costs its samples, not a week of slots; a model pickled with the dense grid (-inf where no
    sample) loads into the same cells and lines."""
    rng = np.random.default_rng(4)
    frame = pd.concat([series(rng.random(n), start=3 * DAY - STEP * n, group=f"g{n}") for n in (1, 5, 400)])
    model = SeasonalMaxReservation().fit(frame)
    assert np.diff(model.cell_starts_).tolist() == [1, 5, 400]
    rows = np.arange(3)
    state = model.__getstate__()
    old = {k: v for k, v in state.items() if k not in ("cell_starts_", "cell_slots_", "cell_values_", "n_slots_")}
    loaded = SeasonalMaxReservation.__new__(SeasonalMaxReservation)
    loaded.__setstate__({**old, "grid_": model._dense(rows)})
    for name in ("cell_starts_", "cell_slots_", "cell_values_"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(model, name))
    np.testing.assert_array_equal(loaded.predict(3 * DAY), model.predict(3 * DAY))
    np.testing.assert_array_equal(loaded.recent(3 * DAY, DAY, rows=rows[1:]), model.recent(3 * DAY, DAY)[1:])


@settings(deadline=None)
@given(
    first=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 9 * DAY), st.floats(0, 8)), min_size=1),
    later=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 10 * DAY), st.floats(0, 8)), min_size=1),
)
def test_samples_merged_into_the_kept_cells_are_the_cells_of_one_fit_on_all(
    first: list[tuple[str, int, float]], later: list[tuple[str, int, float]]
) -> None:
    """A partial fit merges its samples into the slid sparse grid (a search per sample, no sort of the cells): the
    cells, in order, are those of one fit on every sample (new groups, older samples and shared slots too)."""
    columns = ["group", "timestamp", "value"]
    before, after = pd.DataFrame(first, columns=columns), pd.DataFrame(later, columns=columns)
    merged = SeasonalMaxReservation().fit(before).partial_fit(after)
    once = SeasonalMaxReservation().fit(pd.concat([before, after], ignore_index=True))
    assert list(merged.groups_) == list(once.groups_) and merged.grid_origin_ == once.grid_origin_
    for name in ("cell_starts_", "cell_slots_", "cell_values_"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(once, name))


@settings(deadline=None, max_examples=60)
@given(
    samples=st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 60 * STEP), st.floats(0, 8)), min_size=1),
    as_of=st.integers(-10 * STEP, 80 * STEP),
    window_steps=st.integers(1, 60),
    rows=st.lists(st.integers(0, 3), max_size=6),
)
def test_the_recent_line_is_the_dense_grids_slots_of_the_window(
    samples: list[tuple[str, int, float]], as_of: int, window_steps: int, rows: list[int]
) -> None:
    """`recent` reads only the cells from the window's first slot on (a day of a week's): each step shows the dense
    grid's slot holding its last second, NaN where none, for any window, inside the grid or not."""
    model = SeasonalMaxReservation().fit(pd.DataFrame(samples, columns=["group", "timestamp", "value"]))
    chosen = np.asarray([r for r in rows if r < len(model.groups_)], dtype=np.int64)
    window = window_steps * STEP
    times = as_of - window - 1.0 + STEP * np.arange(1, window_steps + 1, dtype=np.float64)
    slots = np.floor((times - model.grid_origin_) / STEP).astype(np.int64)
    inside = (slots >= 0) & (slots < model.n_slots_)
    expected = np.full((chosen.size, window_steps), np.nan)
    expected[:, inside] = model._dense(chosen)[:, slots[inside]]
    expected[expected == -np.inf] = np.nan
    np.testing.assert_array_equal(model.recent(as_of, window, rows=chosen), expected)


@settings(deadline=None, max_examples=30)
@given(
    seed=st.integers(0, 2**32 - 1),
    passes=st.integers(1, 6),
    steps_per_pass=st.integers(1, 3),
    gap_steps=st.integers(0, 3 * DAY // STEP),
)
def test_a_grid_slid_pass_after_pass_is_one_fit_on_every_sample(
    seed: int, passes: int, steps_per_pass: int, gap_steps: int
) -> None:
    """The live loop's pattern: each pass a step or so past the grid's end, so every full row drops its oldest cells
    and gains its newest (`_merged` copies the cells kept once, by runs); some groups skip passes, one joins, one
    stops, and a gap moves the grid days at once. The cells, in order, are those of one fit on every sample."""
    rng = np.random.default_rng(seed)
    history = 8 * DAY // STEP
    frames = [series(rng.random(history), group="full"), series(rng.random(history // 3), group="short")]
    frames.append(series(rng.random(50), start=2 * DAY, group="stopped"))
    model = SeasonalMaxReservation().fit(pd.concat(frames, ignore_index=True))
    seen = list(frames)
    step = history + gap_steps
    for index in range(passes):
        times = STEP * (step + np.arange(steps_per_pass))
        step += steps_per_pass
        groups = ["full", "joined"] + (["short"] if index % 2 else [])
        batch = pd.concat(
            [pd.DataFrame({"group": g, "timestamp": times, "value": rng.random(times.size)}) for g in groups],
            ignore_index=True,
        )
        model.partial_fit(batch)
        seen.append(batch)
    once = SeasonalMaxReservation().fit(pd.concat(seen, ignore_index=True))
    assert list(model.groups_) == list(once.groups_) and model.grid_origin_ == once.grid_origin_
    for name in ("cell_starts_", "cell_slots_", "cell_values_"):
        np.testing.assert_array_equal(getattr(model, name), getattr(once, name))
