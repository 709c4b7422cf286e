"""The forecast selection in blocks of containers and over partitions (issue 17): the same choice, costs and lines as
the whole fleet at once, whatever the blocks or partitions."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone

from models import ensemble
from models.ensemble import (
    CandidateScores,
    FleetUsage,
    FutureUsage,
    RatioBlocks,
    _higher_quantile,
    choose_models,
    labelled_costs,
    labelled_quantiles,
    matched_costs,
    scored_ratios,
    selected_forecaster,
    short_term_candidates,
    usage_after,
)
from models.forecast import nan_quantiles
from models.metrics import usage_to_line_ratio
from models.workload import FleetForecaster, FleetStatistics, WorkloadRecommender, fit_fleet_forecasts
from recommender.arrays import FloatArray
from recommender.settings import ForecastSettings
from tests.conftest import make_usage

P = 288
values = st.one_of(
    st.floats(-1e3, 1e6, allow_subnormal=False),
    st.sampled_from([0.0, -0.0, float("inf"), float("nan"), 1.0, 1.0 + 1e-12]),
)


def direct_matched_costs(
    past_lines: Sequence[FloatArray],
    past_usage: FloatArray,
    target: float,
    members: npt.NDArray[np.bool_] | None = None,
) -> FloatArray:
    """The matched costs as they were computed before blocks: every sample of the members at once."""
    chosen = np.ones(past_usage.shape[1], dtype=bool) if members is None else members
    usage = past_usage[:, chosen]
    known = ~np.isnan(usage)
    costs = np.full((len(past_lines), 2), np.nan)
    used = float(np.sum(usage[known]))
    if used <= 0:
        return costs
    per_container = known.sum(axis=(0, 2))
    for m, lines in enumerate(past_lines):
        line = np.broadcast_to(lines[:, chosen], usage.shape)
        scored = known & ~np.isnan(line)
        if not scored.any():
            continue
        ratio = usage_to_line_ratio(usage[scored], line[scored])
        alpha = _higher_quantile(ratio, 1.0 - target)
        total_line = float(np.sum(line[scored])) * float(known.sum()) / float(scored.sum())
        over = np.zeros(usage.shape, dtype=bool)
        over[scored] = ratio > alpha
        rates = over.sum(axis=(0, 2))[per_container > 0] / per_container[per_container > 0]
        costs[m, 0] = alpha * total_line / used - 1.0 if np.isfinite(alpha) else np.inf
        costs[m, 1] = float(np.percentile(rates, 90))
    return costs


def fixture(seed: int, containers: int = 30, origins: int = 5) -> tuple[list[FloatArray], FloatArray]:
    """Past usage with gaps and idle containers, a day-shaped line, a constant one with zero and unknown levels."""
    rng = np.random.default_rng(seed)
    usage = rng.gamma(2.0, 1.0, size=(origins, containers, P)) * rng.uniform(0.1, 3, size=(1, containers, 1))
    usage[rng.random(usage.shape) < 0.05] = np.nan
    usage[:, 3] = 0.0  # an idle container
    usage[:, 4] = np.nan  # one without samples
    shaped = usage * 1.2 + rng.uniform(0, 1, size=usage.shape)
    shaped[0, 5, :10] = np.nan
    flat = np.fmax.reduce(usage, axis=2, keepdims=True) * rng.uniform(0.5, 1.0, size=(origins, containers, 1))
    flat[1, 6, 0] = 0.0
    flat[2, 7, 0] = np.nan
    return [shaped, np.nan_to_num(flat, nan=1.0), flat], usage


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of about 3 containers: every pass runs over many blocks."""
    monkeypatch.setattr(ensemble, "SELECTION_BLOCK_VALUES", 3 * 5 * P)


@settings(max_examples=150, deadline=None)
@given(st.lists(values, min_size=1, max_size=120), st.integers(1, 7), st.floats(0.0, 1.0), st.integers(0, 2**31))
def test_labelled_quantiles_are_the_exact_higher_quantiles(data: list[float], block: int, q: float, seed: int) -> None:
    ratio = np.asarray(data).reshape(1, -1, 1)
    labels = np.random.default_rng(seed).integers(-1, 3, size=ratio.shape[1])
    blocks = [slice(i, min(i + block, ratio.shape[1])) for i in range(0, ratio.shape[1], block)]
    got, counts = labelled_quantiles(RatioBlocks(lambda rows: ratio[:, rows], blocks), labels, 3, q)
    flat = ratio[0, :, 0]
    for label in range(4):
        members = labels >= 0 if label == 3 else labels == label
        known = flat[members & ~np.isnan(flat)]
        assert counts[label] == known.size
        if known.size:
            assert got[label] == _higher_quantile(known, q)
        else:
            assert np.isnan(got[label])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.floats(0.0, 0.3), st.sampled_from([(1, 8, 1500), (3, 2, 1024), (2, 40)]))
def test_quantiles_by_partition_equal_those_by_sort(seed: int, missing: float, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(seed)
    grid = np.round(rng.gamma(2.0, 1.0, size=shape), 1)  # ties
    grid[rng.random(shape) < missing] = np.nan
    for q, got in zip((0.0, 0.5, 0.99, 1.0), nan_quantiles(grid, (0.0, 0.5, 0.99, 1.0))):
        ordered = np.sort(grid, axis=-1)
        count = np.sum(~np.isnan(grid), axis=-1)
        rank = np.clip(np.ceil(q * count).astype(np.int64) - 1, 0, shape[-1] - 1)
        expected = np.where(count > 0, np.take_along_axis(ordered, rank[..., None], axis=-1)[..., 0], np.nan)
        np.testing.assert_array_equal(got, expected)


def test_ratios_are_usage_to_line_ratio_where_both_are_known() -> None:
    lines, usage = fixture(1)
    for line in lines:
        ratio = scored_ratios(line, usage)
        full = np.broadcast_to(line, usage.shape)
        known = ~np.isnan(usage) & ~np.isnan(full)
        np.testing.assert_array_equal(ratio[known], usage_to_line_ratio(usage[known], full[known]))
        assert np.isnan(ratio[~known]).all()


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocked_matched_costs_equal_the_costs_of_all_samples_at_once(seed: int) -> None:
    lines, usage = fixture(seed)
    members = np.asarray(np.random.default_rng(seed).random(usage.shape[1]) < 0.6, dtype=bool)
    chosen: npt.NDArray[np.bool_] | None
    for chosen in (None, members):
        np.testing.assert_allclose(
            matched_costs(lines, usage, 0.02, chosen), direct_matched_costs(lines, usage, 0.02, chosen), rtol=1e-12
        )
    # The lazy usage after each origin, cut from a grid per block, gives the same costs as the materialised one.
    grid = np.random.default_rng(seed).gamma(2.0, 1.0, size=(30, 9 * P))
    origins = [3 * P, 5 * P, 8 * P]
    past = [np.full((3, 30, 1), 2.0), grid[None, :, :P].repeat(3, axis=0)]
    np.testing.assert_allclose(
        matched_costs(past, FutureUsage(grid, origins, P), 0.01),
        direct_matched_costs(past, usage_after(grid, origins, P), 0.01),
        rtol=1e-12,
    )


@pytest.mark.parametrize("seed", [3, 4])
def test_the_decision_is_the_same_in_one_block_in_many_and_over_partitions(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines, usage = fixture(seed, containers=60)
    settings_ = ForecastSettings(group_min_containers=5)
    selector = selected_forecaster(settings_, short_term_candidates(settings_, 0.01)[:3], 0.01, constant=False)
    whole = selector.__class__(**selector.get_params()).decide(lines, usage)
    monkeypatch.setattr(ensemble, "SELECTION_BLOCK_VALUES", 4 * 5 * P)
    blocked = selector.__class__(**selector.get_params()).decide(lines, usage)
    cuts = [0, 17, 41, 60]
    parts = FleetUsage([usage[:, a:b] for a, b in pairwise(cuts)])
    partitioned = selector.__class__(**selector.get_params()).decide(lines, parts)
    assert set(whole.choice_.tolist()) != set() and (np.bincount(whole.groups_) >= 5).all()
    for other in (blocked, partitioned):
        for name in ("groups_", "choice_", "factors_", "own_factors_", "outliers_", "group_factors_raw_"):
            np.testing.assert_array_equal(getattr(other, name), getattr(whole, name), err_msg=name)
        np.testing.assert_allclose(other.fleet_costs_, whole.fleet_costs_, rtol=1e-12)
        np.testing.assert_allclose(other.group_costs_, whole.group_costs_, rtol=1e-12)
        assert other.fleet_factor_ == whole.fleet_factor_
    # Each partition's part: its containers' state, and sketch shares that merge to the fleet's sketch.
    shares = [partitioned.take(i) for i in range(3)]
    np.testing.assert_array_equal(np.concatenate([p.choice_ for p in shares]), whole.choice_)
    merged = FleetStatistics.merge(
        [FleetStatistics(sample_steps=(np.empty(0, np.int64),) * 2, calibration={"x": p.ratio_sketch_}) for p in shares]
    ).calibration["x"]
    assert all(np.array_equal(a, b) for a, b in zip(merged, whole.ratio_sketch_))
    assert CandidateScores().groups(parts, 3).tolist() == whole.groups_.tolist()
    costs = labelled_costs(lines, parts, 0.01, whole.groups_, int(whole.groups_.max()) + 1)
    choice = choose_models(costs, whole.groups_, 0.01, 0.1, 5)[0]
    assert choice.tolist() == whole.choice_.tolist()


def fleet_usage() -> pd.DataFrame:
    """Nine workloads over nine days, three of them started two days late (a narrower grid in their partition), and
    one burstier."""
    early = make_usage(workloads=6, pods=2, days=9, seed=1)
    late = make_usage(workloads=3, pods=1, days=7, start=1_700_000_000 + 2 * 86400, seed=2)
    late["workload"] = late["workload"].map({"w0": "x0", "w1": "x1", "w2": "x2"})
    late["pod"] = late["workload"] + "-p0"
    late.loc[late["workload"] == "x1", "cpu_cores"] *= np.where(np.arange((late["workload"] == "x1").sum()) % 37, 1, 4)
    return pd.concat([early, late], ignore_index=True)


@pytest.mark.parametrize("most", [0, 5])
def test_a_fleet_fitted_in_partitions_chooses_and_recommends_as_in_one_piece(most: int) -> None:
    # `most`: the containers the choice is made on (0: all 9; 5: a sample, the same one in one piece or in parts).
    usage = fleet_usage()
    settings_ = ForecastSettings(group_min_containers=2, selection_max_containers=most)
    whole = WorkloadRecommender(forecast=FleetForecaster.from_settings(settings_)).fit(usage)
    data_end = int(usage["timestamp"].max())
    cuts = [["w0", "w1"], ["w2", "w3", "w4", "w5"], ["x0", "x1", "x2"]]
    parts = [
        WorkloadRecommender(forecast=FleetForecaster.from_settings(settings_)).fit(
            usage[usage["workload"].isin(names)], data_end=data_end, fit_forecasts=False
        )
        for names in cuts
    ]
    assert len({p.cpu_grid_.shape[1] for p in parts}) == 2  # the late partition's grid is narrower
    fit_fleet_forecasts(parts)
    fleet = FleetStatistics.merge([p.fleet_statistics() for p in parts])
    # The finish step of a partitioned run (calibrate with the merged statistics) leaves the fleet's factors.
    parts = [p.calibrate_with_fleet(fleet) for p in parts]
    for (key, forecast), *others in zip(whole._forecasts(), *(p._forecasts() for p in parts)):
        for line in ("short_term", "request", "long_term"):
            model = getattr(forecast, line)
            np.testing.assert_array_equal(
                np.concatenate([getattr(o[1], line).choice_ for o in others]), model.choice_, err_msg=key
            )
            np.testing.assert_array_equal(
                np.concatenate([getattr(o[1], line).factors_ for o in others]), model.factors_, err_msg=key
            )
    expected = whole.predict()
    got = [r for p in parts for r in p.predict().recommendations]
    assert [r.key for r in got] == [r.key for r in expected.recommendations]
    for a, b in zip(expected.recommendations, got):
        assert a.model_dump() == b.model_dump()


def test_lines_sharing_candidates_and_usage_score_each_candidate_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The short-term line's candidates include the request line's constant ones: with one `CandidateScores` the
    # request line reads their scores instead of scoring them again, and decides exactly as on its own.
    lines, usage = fixture(5, containers=60)
    settings_ = ForecastSettings(group_min_containers=5)
    candidates = short_term_candidates(settings_, 0.01)[:3]
    short = selected_forecaster(settings_, candidates, 0.01, constant=False)
    request = selected_forecaster(settings_, candidates[1:], 0.01, constant=True)
    alone = clone(request).decide(lines[1:], usage)
    scored: list[int] = []
    labelled = ensemble.labelled_costs

    def counting(past_lines: Sequence[FloatArray], *args: object) -> FloatArray:
        scored.append(len(past_lines))
        return labelled(past_lines, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ensemble, "labelled_costs", counting)
    scores = CandidateScores()
    short.decide(lines, usage, scores)
    shared = clone(request).decide(lines[1:], usage, scores)
    assert scored == [3]
    for name in ("groups_", "choice_", "costs_", "fleet_costs_", "group_costs_", "factors_"):
        np.testing.assert_array_equal(getattr(shared, name), getattr(alone, name), err_msg=name)
    # Another level is another score.
    clone(request).set_params(target_violation=0.05).decide(lines[1:], usage, scores)
    assert scored == [3, 2]
