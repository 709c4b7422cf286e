"""The composite estimator on plain frames: pooling, the output contract, and the sklearn estimator contract."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from models.histogram import DecayingHistogram
from models.reservation import PercentileReservation, SeasonalMaxReservation
from models.workload import FleetForecaster, WorkloadRecommender
from tests.conftest import make_usage


def test_one_recommendation_per_workload_container_with_pods_pooled() -> None:
    usage = make_usage(workloads=3, pods=4, days=2)
    result = WorkloadRecommender().fit(usage).predict()
    assert len(result.recommendations) == 3
    first = result.recommendations[0]
    assert first.history is not None and first.history.pods == 4
    assert first.cpu is not None and len(first.cpu.short_term) == 288
    assert first.cpu.lower_bound <= first.cpu.target <= first.cpu.upper_bound
    assert result.step_seconds == 300 and result.horizon_seconds == 86400
    assert first.current.cpu_limit_cores == 2.0


def test_targets_grow_with_usage_and_cover_p90() -> None:
    usage = make_usage(workloads=2, pods=1, days=3)
    result = WorkloadRecommender().fit(usage).predict()
    small, big = (r.cpu for r in result.recommendations)
    assert small is not None and big is not None
    assert big.target > small.target
    p90 = usage[usage["workload"] == "w0"]["cpu_cores"].quantile(0.9)
    # The target is the request forecast, calibrated to violate about 2 % of samples: well above the p90.
    assert small.target >= p90
    assert small.models is not None and "Forecaster" in small.models.target


def test_resource_without_samples_is_none() -> None:
    usage = make_usage(workloads=1, pods=1, days=1).assign(memory_bytes=np.nan)
    rec = WorkloadRecommender().fit(usage).predict().recommendations[0]
    assert rec.memory is None and rec.cpu is not None


def test_no_recommendation_for_a_resource_below_the_sample_minimum() -> None:
    # Issue 13: a workload whose CPU cells are all empty, beside others, was sized at the 25m pod minimum.
    usage = make_usage(workloads=2, pods=1, days=1)
    usage.loc[usage["workload"] == "w0", "cpu_cores"] = np.nan
    empty, full = WorkloadRecommender().fit(usage).predict().recommendations
    assert empty.cpu is None and empty.memory is not None and full.cpu is not None
    assert empty.history is not None and empty.history.cpu_samples == 0 and empty.history.memory_samples == 288
    few = make_usage(workloads=1, pods=1, days=1).iloc[:11]
    model = WorkloadRecommender().fit(few)
    rec = model.predict().recommendations[0]
    assert rec.cpu is None and rec.memory is None
    # The minimum counts every sample seen, also across incremental fits.
    more = make_usage(workloads=1, pods=1, days=1).iloc[11:13]
    rec = model.partial_fit(more).predict().recommendations[0]
    assert rec.cpu is not None and rec.history is not None and rec.history.cpu_samples == 13
    thirteen = make_usage(workloads=1, pods=1, days=1).iloc[:13]
    assert WorkloadRecommender(min_samples=20).fit(thirteen).predict().recommendations[0].cpu is None


def test_policy_settings_are_used() -> None:
    usage = make_usage(workloads=1, pods=1, days=2)
    plain = WorkloadRecommender().fit(usage).predict().recommendations[0].cpu
    capped = WorkloadRecommender(max_allowed_cpu_cores=0.1).fit(usage).predict().recommendations[0].cpu
    assert plain is not None and capped is not None
    assert capped.target == 0.1 and capped.uncapped_target == pytest.approx(plain.target)


def test_oom_events_raise_memory() -> None:
    usage = make_usage(workloads=1, pods=1, days=2)
    oom = pd.DataFrame(
        {
            "timestamp": [int(usage["timestamp"].max())],
            "namespace": "ns",
            "workload": "w0",
            "pod": "w0-p0",
            "container": "main",
        }
    )
    plain = WorkloadRecommender().fit(usage).predict().recommendations[0].memory
    bumped = WorkloadRecommender().fit(usage, oom_events=oom).predict().recommendations[0].memory
    assert plain is not None and bumped is not None
    assert bumped.target > plain.target * 1.15


def test_oom_kills_are_counted_per_container_and_continued() -> None:
    usage = make_usage(workloads=2, pods=1, days=2)
    end = int(usage["timestamp"].max())
    kill = {"namespace": "ns", "workload": "w0", "pod": "w0-p0", "container": "main"}
    model = WorkloadRecommender().fit(
        usage, oom_events=pd.DataFrame([{"timestamp": end - 600, **kill}, {"timestamp": end, **kill}])
    )
    counts = {r.workload: r.history.oom_kills for r in model.predict().recommendations if r.history}
    assert counts == {"w0": 2, "w1": 0}
    later = make_usage(workloads=2, pods=1, days=0.5, start=end + 300)
    model.partial_fit(later, oom_events=pd.DataFrame([{"timestamp": end + 600, **kill}]))
    assert {r.workload: r.history.oom_kills for r in model.predict().recommendations if r.history} == {"w0": 3, "w1": 0}


def test_a_model_stored_before_oom_counts_loads_with_one_kill_per_known_group() -> None:
    usage = make_usage(workloads=2, pods=1, days=1)
    kill = {
        "timestamp": int(usage["timestamp"].max()),
        "namespace": "ns",
        "workload": "w1",
        "pod": "w1-p0",
        "container": "main",
    }
    model = WorkloadRecommender().fit(usage, oom_events=pd.DataFrame([kill, kill]))
    old_state = model.__getstate__()
    old_state["oom_groups_"] = np.asarray(old_state.pop("oom_kills_").index, dtype=str)
    restored = pickle.loads(pickle.dumps(model))  # a model as joblib loads it from a version directory...
    restored.__setstate__(old_state)  # ...with the state an older version stored
    kills = {r.workload: r.history.oom_kills for r in restored.predict().recommendations if r.history}
    assert kills == {"w0": 0, "w1": 1}
    assert restored.predict().recommendations[1].memory == model.predict().recommendations[1].memory  # OOM bump kept


def test_selected_lines_carry_their_backtest_quality() -> None:
    line = WorkloadRecommender().fit(make_usage(workloads=1, pods=1, days=10)).predict().recommendations[0].cpu
    assert line is not None and line.models is not None
    assert set(line.models.quality) == {"target", "short_term", "long_term"}
    for quality in line.models.quality.values():
        assert quality.cost is not None and quality.cost >= 0
        assert quality.next_best_cost is not None and quality.next_best_cost >= 0
        # The fleet chose by overprovision at the matched risk: the chosen one is the fleet's cheapest fair one.
        assert quality.fleet_overprovision is not None and np.isfinite(quality.fleet_overprovision)
        assert 0.25 <= quality.calibration_factor <= 4.0
    # The cost in the model's name is the same figure, rounded.
    assert f"cost={line.models.quality['short_term'].cost:.3g}" in line.models.short_term


@pytest.mark.parametrize(
    "estimator", [DecayingHistogram(), SeasonalMaxReservation(), PercentileReservation(), WorkloadRecommender()]
)
def test_estimator_contract(estimator: object) -> None:
    # Parameters only in __init__ (get_params/clone round-trip), learned state only after fit.
    clone(estimator)
    learned = [name for name in vars(estimator) if name.endswith("_") and not name.startswith("_")]
    assert learned == []
    with pytest.raises(NotFittedError):
        if isinstance(estimator, WorkloadRecommender):
            estimator.predict()
        elif isinstance(estimator, SeasonalMaxReservation):
            estimator.predict(0)
        elif isinstance(estimator, PercentileReservation):
            estimator.predict()
        else:
            estimator.quantile(0.5)  # type: ignore[attr-defined]


@pytest.mark.parametrize("cut_days", [0.5, 2.0, 3.5])
def test_partial_fit_equals_one_fit(cut_days: float) -> None:
    usage = make_usage(workloads=2, pods=3, days=4)
    cut = int(usage["timestamp"].min() + cut_days * 86400)
    # A pod that appears only in the second part, and one only in the first.
    late = usage[(usage["pod"] == "w0-p0") & (usage["timestamp"] >= cut)].assign(pod="w0-late")
    usage = pd.concat([usage[~((usage["pod"] == "w1-p2") & (usage["timestamp"] >= cut))], late])
    whole = WorkloadRecommender().fit(usage).predict()
    parts = (
        WorkloadRecommender()
        .fit(usage[usage["timestamp"] < cut])
        .partial_fit(usage[usage["timestamp"] >= cut])
        .predict()
    )
    assert whole.as_of == parts.as_of
    for a, b in zip(whole.recommendations, parts.recommendations):
        assert a.key == b.key
        assert a.history == b.history
        assert a.current == b.current
        for resource in ("cpu", "memory"):
            x, y = getattr(a, resource), getattr(b, resource)
            for field in ("target", "lower_bound", "upper_bound", "long_term"):
                assert getattr(x, field) == pytest.approx(getattr(y, field), rel=1e-9), (resource, field)
            np.testing.assert_allclose(x.short_term, y.short_term, rtol=1e-12)


def test_a_pass_of_one_sample_per_pod_keeps_the_learned_sample_interval() -> None:
    """A live pass reads one 5-minute step: it shows no interval between two samples of a pod, and the interval (the
    bounds' confidence) stays the version's, not VPA's 60 s default."""
    usage = make_usage(workloads=2, pods=3, days=3)
    step = usage[usage["timestamp"] == usage["timestamp"].max()].assign(timestamp=lambda u: u["timestamp"] + 300)
    model = WorkloadRecommender().fit(usage)
    assert model.sample_interval_seconds_ == 300
    before = {r.key: (r.cpu.lower_bound, r.cpu.upper_bound) for r in model.predict().recommendations}
    model.partial_fit(step)
    assert model.sample_interval_seconds_ == 300
    # The same step fitted with the rest: the bounds of one fit and of the continued one agree.
    whole = WorkloadRecommender().fit(pd.concat([usage, step])).predict()
    for a, b in zip(whole.recommendations, model.predict().recommendations):
        assert (a.cpu.lower_bound, a.cpu.upper_bound) == pytest.approx((b.cpu.lower_bound, b.cpu.upper_bound))
    assert before  # the model served before the pass


def test_forecast_lines_far_after_the_data_keep_the_time_of_day() -> None:
    usage = make_usage(workloads=1, pods=1, days=9)
    model = WorkloadRecommender(forecast=FleetForecaster(stale_after_seconds=1000 * 86400)).fit(usage)
    end = int(usage["timestamp"].max()) + 1
    near = model.predict(as_of=end + 86400).recommendations[0].cpu
    far = model.predict(as_of=end + 400 * 86400).recommendations[0].cpu
    assert near is not None and far is not None
    assert near.short_term == pytest.approx(far.short_term)
    assert near.models is not None and "Forecaster" in near.models.short_term


def test_a_decision_long_after_the_last_sample_is_stale() -> None:
    # Issue 13: staleness was judged at the data's end only, so a model used days later called everything fresh.
    usage = make_usage(workloads=1, pods=1, days=9)
    model = WorkloadRecommender().fit(usage)
    end = int(usage["timestamp"].max()) + 1
    fresh = model.predict(as_of=end + 86400).recommendations[0].cpu
    late = model.predict(as_of=end + 4 * 86400).recommendations[0].cpu
    assert fresh is not None and not fresh.stale
    # Issue 39: what a stale page says is what it shows: every line holds the current request (here the limit, as
    # Kubernetes defaults the request to it) flat, so no room it asked for is offered to batch pods; no peak time.
    assert late is not None and late.stale and set(late.short_term) == {late.long_term} == {2.0}
    assert late.peak.value == 2.0 and late.peak.at is None
    assert late.models is not None and late.models.short_term == "stale: the current request (its limit) held flat"
    with_request = model.fit(usage.assign(cpu_request_cores=1.5)).predict(as_of=end + 4 * 86400)
    held = with_request.recommendations[0].cpu
    assert held is not None and set(held.short_term) == {held.long_term} == {1.5}
    assert held.models is not None and held.models.short_term == "stale: the current request held flat"
    bare = model.fit(usage.drop(columns=["cpu_limit_cores"])).predict(as_of=end + 4 * 86400).recommendations[0].cpu
    assert bare is not None and set(bare.short_term) == {bare.target}
    assert bare.models is not None and "recommended request" in bare.models.short_term


def test_risk_levels_per_namespace_override_and_are_recorded() -> None:
    """An override builds that namespace's lines at its own level (lower at 5 % than the default 1 %), the JSON says
    which level each line was built for, and the default level stays for the others."""
    usage = make_usage(workloads=2, pods=1, days=10)
    loose = usage.assign(namespace="batch")
    both = pd.concat([usage, loose], ignore_index=True).sort_values(
        ["namespace", "workload", "pod", "container", "timestamp"]
    )
    model = WorkloadRecommender(target_violation_overrides={"batch": 0.05})
    recs = {(r.namespace, r.workload): r for r in model.fit(both).predict().recommendations}
    strict, relaxed = recs[("ns", "w0")].cpu, recs[("batch", "w0")].cpu
    assert strict is not None and relaxed is not None and strict.levels is not None and relaxed.levels is not None
    assert strict.levels.short_term == strict.levels.target == strict.levels.long_term == 0.01
    assert relaxed.levels.short_term == relaxed.levels.target == relaxed.levels.long_term == 0.05
    assert max(relaxed.short_term) < max(strict.short_term)


def test_a_week_of_zero_memory_keeps_vpas_minimum() -> None:
    """A container whose working set read 0 all week (a broken metric: a running one always has some) is not sized
    at 0 bytes by the peak bound: VPA's minimum stands, and there is no limit floor."""
    usage = make_usage(workloads=2, pods=1, days=8)
    usage.loc[usage["workload"] == "w0", "memory_bytes"] = 0.0
    recs = {r.workload: r.memory for r in WorkloadRecommender().fit(usage).predict().recommendations}
    zero, used = recs["w0"], recs["w1"]
    assert zero is not None and used is not None
    assert zero.target == pytest.approx(250 * 2**20) and zero.limit_floor is None
    assert used.limit_floor is not None and used.target <= used.limit_floor


def test_a_zero_limit_is_no_limit() -> None:
    """An export that writes an unset limit as 0 gets no limit back (we never add one), not one at the request."""
    usage = make_usage(workloads=2, pods=1, days=3).assign(cpu_limit_cores=0.0, memory_limit_bytes=0.0)
    usage.loc[usage["workload"] == "w1", ["cpu_limit_cores", "memory_limit_bytes"]] = [2.0, 8e9]
    recs = {r.workload: r for r in WorkloadRecommender().fit(usage).predict().recommendations}
    unset, set_ = recs["w0"], recs["w1"]
    assert unset.cpu is not None and unset.memory is not None and set_.cpu is not None and set_.memory is not None
    assert unset.cpu.limit is None and unset.cpu.limit_rule is None
    assert unset.memory.limit is None and unset.memory.limit_rule is None
    assert set_.cpu.limit is not None and set_.memory.limit is not None


def test_memory_request_stays_within_the_week_peak_and_the_limit_above_it() -> None:
    usage = make_usage(workloads=1, pods=1, days=10).assign(memory_limit_bytes=8e9)
    memory = WorkloadRecommender().fit(usage).predict().recommendations[0].memory
    assert memory is not None and memory.limit_floor is not None
    peak = usage["memory_bytes"][usage["timestamp"] >= usage["timestamp"].max() - 7 * 86400].max()
    assert memory.target <= peak * 1.15 + 1e-6
    assert memory.limit_floor == pytest.approx(peak * 1.15)
    assert memory.limit is not None and memory.limit >= memory.limit_floor and memory.limit_rule is not None


def _replicas(days: int = 15, seed: int = 2) -> pd.DataFrame:
    """One workload of four pods at different loads (a skewed load balancer), 5-minute samples."""
    rng = np.random.default_rng(seed)
    times = np.arange(1_700_000_000, 1_700_000_000 + days * 86400, 300)
    frames = [
        pd.DataFrame(
            {
                "timestamp": times,
                "namespace": "ns",
                "workload": "web",
                "pod": f"web-{p}",
                "container": "main",
                "cpu_cores": level * rng.lognormal(0.0, 0.3, times.size),
                "memory_bytes": level * 1e9 * rng.lognormal(0.0, 0.05, times.size),
            }
        )
        for p, level in enumerate((1.0, 0.7, 0.5, 0.4))
    ]
    return pd.concat(frames, ignore_index=True)


def test_a_request_of_several_pods_holds_the_level_for_every_pods_samples() -> None:
    usage = _replicas()
    window = usage[usage["timestamp"] >= usage["timestamp"].max() - 14 * 86400]

    def request(**params: float) -> tuple[float, float, float]:
        model = WorkloadRecommender(**params).fit(usage)
        rec = model.predict().recommendations[0]
        assert rec.cpu.models is not None and rec.memory.models is not None
        # The factor is stated beside the calibration's, for every line; memory's is 1.
        factors = {line: quality.pod_factor for line, quality in rec.cpu.models.quality.items()}
        assert all(q.pod_factor == 1.0 for q in rec.memory.models.quality.values())
        return rec.cpu.target, rec.memory.target, factors["target"]

    cpu, memory, factor = request()
    busiest_cpu, busiest_memory, none = request(cpu_pod_spread_half_life_seconds=0.0)
    assert none == 1.0 and 0.5 < factor < 1.0
    assert cpu == pytest.approx(busiest_cpu * factor)
    # A small fleet's line is its own 14-day (1 - P) quantile: of every pod's samples, not of each step's busiest.
    assert np.mean(window["cpu_cores"] > cpu) == pytest.approx(0.01, abs=0.004)
    assert np.mean(window["cpu_cores"] > busiest_cpu) < 0.004
    # Memory keeps the busiest pod's level (off by default).
    assert memory == busiest_memory
