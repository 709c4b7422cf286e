"""The node resource model: pooled forecasts, the node view served and written, and the --nodes backtest's parts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from models.nodes import NodeForecaster, PooledNodeUsage, rise_allowance
from models.vpa import DecayingHistogram
from models.workload import FleetForecaster
from pipelines.node_backtest import (
    KOORDINATOR_BUCKETS,
    MethodSummary,
    NodeBacktestResult,
    Offered,
    Placement,
    forward_max,
    koordinator_peaks,
    last_measured,
    node_sums,
    outage_mask,
    pack_pods,
    reported,
    tuned_threshold,
)
from recommender import colocation
from recommender import koordinator as k
from recommender.errors import ModelStoreError
from recommender.placement import NodeLoads, Timeline, node_capacity, node_metadata, node_reclaimable
from recommender.resources import NodeForecast, NodePod, NodeResourceLines
from recommender.settings import ColocationSettings, ForecastSettings
from recommender.units import GIB
from serving.settings import ExtenderSettings
from tests.k8s import container, node, pod, running
from tests.recs import STEPS
from tests.support.compare import assert_close

DAY = 86400
FAST = ForecastSettings(selection_days=2, seasonal_days=2, history_days=3)


def alternating(days: int = 4, start: int = 1_700_006_400) -> pd.DataFrame:
    """Two pods on node a peaking in turn (4 cores for 12 h each), a batch pod beside them, one pod on node b."""
    times = np.arange(start, start + days * DAY, 300)
    first_half = ((times - start) % DAY) < DAY / 2
    rows = []
    for name, cpu, node_name, priority in (
        ("morning", np.where(first_half, 4.0, 0.5), "a", "koord-prod"),
        ("evening", np.where(first_half, 0.5, 4.0), "a", "koord-prod"),
        ("batch", np.full(times.size, 3.0), "a", "koord-batch"),
        ("alone", np.full(times.size, 1.0), "b", "koord-prod"),
    ):
        rows.append(
            pd.DataFrame(
                {
                    "timestamp": times,
                    "namespace": "ns",
                    "workload": name,
                    "pod": f"{name}-0",
                    "container": "main",
                    "cpu_cores": cpu,
                    "memory_bytes": 1e9,
                    "cpu_request_cores": 2.0,
                    "memory_request_bytes": 2e9,
                    "node": node_name,
                    "priority_class": priority,
                }
            )
        )
    return pd.concat(rows, ignore_index=True)


def test_the_node_line_forecasts_the_pooled_sum_not_the_sum_of_peaks() -> None:
    usage = alternating()
    found = {n.node: n for n in NodeForecaster(FleetForecaster.from_settings(FAST)).fit(usage).predict()}
    a = found["a"]
    assert a.cpu is not None and a.memory is not None
    # the two pods never peak together: the pooled line stays near 4.5 cores, far below the 8 of the two peaks
    assert 4.5 <= max(a.cpu.short_term) < 6.0
    assert a.cpu.long_term < 6.0
    assert a.cpu.limit == 4.0 and a.memory.limit == 4e9  # the batch pod's request is not reserved for
    assert a.cpu.last_usage == pytest.approx(4.5)
    assert {p.pod for p in a.pods} == {"morning-0", "evening-0"}
    assert found["b"].cpu is not None and max(found["b"].cpu.short_term) == pytest.approx(1.0, rel=0.3)


def test_partial_fit_slides_the_grid_to_the_new_samples() -> None:
    usage = alternating(days=4)
    end = int(usage["timestamp"].min()) + 3 * DAY
    model = NodeForecaster(FleetForecaster.from_settings(FAST)).fit(usage[usage["timestamp"] < end])
    model.partial_fit(usage[usage["timestamp"] >= end])
    assert model.data_end_ == int(usage["timestamp"].max())
    full = NodeForecaster(FleetForecaster.from_settings(FAST)).fit(usage)
    np.testing.assert_allclose(model.cpu_grid_, full.cpu_grid_, equal_nan=True)


@pytest.mark.parametrize("stops_early_seconds", [0, 300, 7 * 3600, 2 * DAY])
def test_pools_of_partitions_ending_apart_merge_into_the_fleets_pool(stops_early_seconds: int) -> None:
    """A streamed read pools each partition at its own newest sample: merged, the pools are the fleet's one pool
    (moved onto the latest end: the early partition's oldest steps fall out, its last ones are empty), and the node
    lines fitted on them are one fit's."""
    usage = alternating().sort_values(["namespace", "workload", "pod", "container", "timestamp"], ignore_index=True)
    early = usage["workload"].isin(["evening", "alone"])
    usage = usage[~early | (usage["timestamp"] <= usage["timestamp"].max() - stops_early_seconds)]
    early = usage["workload"].isin(["evening", "alone"])
    model = NodeForecaster(FleetForecaster.from_settings(FAST))
    parts = [model.pool(usage[early]), model.pool(usage[~early])]
    assert parts[0] is not None and parts[1] is not None
    if stops_early_seconds:
        assert parts[0].grid_end < parts[1].grid_end
    merged = PooledNodeUsage.merge(parts)
    whole = model.pool(usage)
    assert merged is not None and whole is not None
    assert (merged.nodes, merged.data_end, merged.grid_end) == (whole.nodes, whole.data_end, whole.grid_end)
    for resource in ("cpu", "memory"):
        np.testing.assert_array_equal(merged.observed[resource], whole.observed[resource])
        np.testing.assert_allclose(merged.grid(resource), whole.grid(resource), equal_nan=True)
    fitted = NodeForecaster(FleetForecaster.from_settings(FAST)).fit_pooled(merged).predict()
    one = NodeForecaster(FleetForecaster.from_settings(FAST)).fit(usage).predict()
    assert_close([n.model_dump(mode="json") for n in fitted], [n.model_dump(mode="json") for n in one])


def test_a_usage_without_placement_is_a_clear_error() -> None:
    usage = alternating().assign(node=None)
    with pytest.raises(ValueError, match="with a node"):
        NodeForecaster(FleetForecaster.from_settings(FAST)).fit(usage)


def test_rise_allowance_is_a_quantile_of_the_recent_rises() -> None:
    grid = np.array([[1.0, 2.0, 1.0, 4.0, np.nan, 5.0]])
    assert rise_allowance(grid, 1.0, 10)[0] == pytest.approx(3.0)
    assert rise_allowance(np.array([[2.0, 1.0, 0.5]]), 1.0, 10)[0] == 0.0


def test_pack_pods_first_fit_on_a_seeded_order() -> None:
    requests = {"cpu": np.array([3.0, 2.0, 2.0, 1.0, 9.0]), "memory": np.full(5, GIB)}
    size = {"cpu": 4.0, "memory": 16 * GIB}
    node_of, allocatable = pack_pods(requests, size, seed=0)
    again, _ = pack_pods(requests, size, seed=0)
    assert node_of.tolist() == again.tolist()
    used = np.bincount(node_of, weights=requests["cpu"])
    assert np.all(used <= allocatable["cpu"] + 1e-9)
    assert allocatable["cpu"][node_of[4]] == 9.0 and np.sum(node_of == node_of[4]) == 1  # too big: a node of its own
    assert len(allocatable["cpu"]) == 4  # 3+1, 2+2 in some order, and the big one: first fit never needs more here


def test_backtest_helpers() -> None:
    values = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]])
    measured = np.array([[True, True, False, False, True]])
    last, age = last_measured(values, measured)
    np.testing.assert_allclose(last, [[np.nan, 1.0, 2.0, 2.0, 2.0]])
    np.testing.assert_allclose(age, [[np.inf, 1, 1, 2, 3]])
    np.testing.assert_allclose(forward_max(np.array([[1.0, 3.0, 2.0, 0.0]]), 2), [[3.0, 3.0, 2.0, 0.0]])
    np.testing.assert_allclose(
        node_sums(np.array([[1.0, np.nan], [2.0, np.nan], [5.0, 1.0]]), np.array([0, 0, 1]), 2),
        [[3.0, np.nan], [5.0, 1.0]],
    )
    mask = outage_mask(10, 10_000, 0.02, seed=3)
    assert 0.01 < mask.mean() < 0.03


def node_result(**fields: Any) -> NodeBacktestResult:
    """A node backtest's result on one node and one decision day, empty but for `fields` (the choices read only
    their own part)."""
    empty: dict[str, Any] = {"offered": {}, "summaries": {}, "sweeps": {}, "fair": {}}
    return NodeBacktestResult(
        placement=Placement(np.zeros(1, dtype=np.int64), ["n"], {}, "test"),
        decision_days=[7],
        first_step=0,
        step_seconds=300,
        origin=0,
        seconds=0.0,
        **{**empty, **fields},
    )


def test_the_chosen_margin_is_the_smallest_as_safe_as_koordinator_on_validation_days() -> None:
    def summary(violations: int) -> MethodSummary:
        return MethodSummary(
            reclaimed=1.0, reclaimed_share=0.1, violations=violations, violation_rate=0.0, zero_drops=0, mean_change=0.0
        )

    sweep = [(0.0, {"validation": summary(9)}), (0.01, {"validation": summary(3)}), (0.02, {"validation": summary(1)})]
    result = node_result(
        summaries={
            "validation": {
                "complete": {"cpu": {"koordinator_usage": summary(3)}, "memory": {"koordinator_usage": summary(0)}}
            }
        },
        sweeps={"cpu": {"ours_forecast_only": sweep}, "memory": {"ours_forecast_only": sweep}},
    )
    assert result.chosen_margin("cpu", "ours_forecast_only") == 0.01  # 0 % had 9 violations, 1 % ties Koordinator's 3
    assert result.chosen_margin("memory", "ours_forecast_only") is None  # none as safe as Koordinator's 0


@pytest.mark.parametrize("resource", ["cpu", "memory"])
def test_koordinator_peaks_are_koordlets_decaying_histogram_percentiles(resource: str) -> None:
    """Each step's value equals the percentile of the VPA histogram (koordlet's copy of it) fed the same samples."""
    rng = np.random.default_rng(5)
    scale = 4.0 if resource == "cpu" else 8 * GIB
    values = rng.gamma(2.0, scale / 2, size=(3, 600))
    values[1, 100:140] = np.nan  # a gap: no samples, the histogram keeps its weights
    values[2, :50] = np.nan  # a pod that starts later
    found = koordinator_peaks(values, resource, 300, 10, 600)
    quantile = colocation.KOORDINATOR_MID_QUANTILE[resource]
    for row in range(3):
        histogram = DecayingHistogram(
            KOORDINATOR_BUCKETS[resource], 1e-12, colocation.KOORDINATOR_MID_HALF_LIFE_SECONDS[resource]
        )
        for t in range(600):
            if t >= 10:
                expected = histogram.percentile(quantile) if not histogram.is_empty() else np.nan
                np.testing.assert_allclose(found[row, t - 10], expected, rtol=1e-12, equal_nan=True)
            if not np.isnan(values[row, t]):
                histogram.add_at(float(values[row, t]), 1.0, 1_700_000_000 + 300.0 * t)
    assert np.isnan(found[2, 0]) and not np.isnan(found[2, -1])


def test_a_controller_holds_the_last_report_through_a_gap() -> None:
    # values computed at steps 2..5 from the data before each; step 3 and 4 not measured: 4 and 5 see step 2's report
    computed = np.array([[10.0, 20.0, 30.0, 40.0]])
    measured = np.array([[True, True, True, False, False, True]])
    np.testing.assert_allclose(reported(computed, measured, 2), [[10.0, 20.0, 20.0, 20.0]])


def test_koordinator_tuned_to_the_violations_of_the_method_it_is_compared_with() -> None:
    hp = np.array([[5.0, 5.0, 9.0, 5.0]])
    offers = Offered(hp, np.array([10.0]), hp, hp)
    parts = {"validation": slice(0, 2), "held_out": slice(2, None)}

    def offer(percent: float) -> np.ndarray:
        return np.full((1, 4), percent / 10.0)

    # validation usage 5: an offer above 5 violates both validation steps; at most 0 allowed -> 50 %
    tuned = tuned_threshold(offers, offer, [70.0, 60.0, 50.0, 40.0], 0, parts, 300)
    assert tuned is not None and tuned[0] == 50.0
    assert tuned[1]["held_out"].violations == 1  # the 9 on the held-out days
    assert tuned_threshold(offers, offer, [90.0, 80.0], 0, parts, 300) is None


AS_OF = 1_800_000_000
TIMELINE = Timeline(AS_OF, 300, STEPS)


def forecast_of(last_sample: int) -> NodeForecast:
    lines = NodeResourceLines(
        limit=2.0,
        last_usage=2.0,
        jump=0.5,
        largest_jump=0.8,
        recent_usage=[2.0] * 12,
        short_term=[3.0] * STEPS,
        long_term=3.5,
    )
    memory = NodeResourceLines(
        limit=2 * GIB, last_usage=GIB, jump=0.0, recent_usage=[GIB] * 12, short_term=[GIB] * STEPS, long_term=GIB
    )
    return NodeForecast(
        node="a",
        last_sample=last_sample,
        cpu=lines,
        memory=memory,
        pods=[NodePod(namespace="ns", pod="old", workload="old", priority_class="koord-prod")],
    )


def view(last_sample: int, old_request: str = "2") -> NodeLoads:
    pods = [
        running(pod("deployment", "old", [container("main", {"requests": {"cpu": old_request}})]), "ns", "a", "old"),
        running(pod("deployment", "new", [container("main", {"requests": {"cpu": "1"}})]), "ns", "a", "new"),
        running(
            pod(
                "deployment",
                "spare",
                [container("main", {"requests": {"cpu": "4"}})],
                labels={k.PRIORITY_CLASS_LABEL: k.BATCH},
            ),
            "ns",
            "a",
            "spare",
        ),
    ]
    return NodeLoads.build(
        pods,
        [node("a", cpu="10", memory="16Gi")],
        lambda key: None,
        TIMELINE,
        ExtenderSettings(),
        {"a": forecast_of(last_sample)},
    )


COLOCATION = ColocationSettings(
    cpu_margin_fraction=0.1,
    memory_margin_fraction=0.1,
    cpu_forecast_only_margin_fraction=0.2,
    memory_forecast_only_margin_fraction=0.2,
    cpu_reclaim_ratio_margin_fraction=0.1,
    memory_reclaim_ratio_margin_fraction=0.1,
)


def test_node_view_starts_from_the_pooled_forecast_and_adds_pods_placed_since() -> None:
    loads = view(AS_OF)
    cpu, _ = loads.node_line("a")
    assert cpu[0] == pytest.approx(
        3.0 + 1.0 + 4.0
    )  # extender load: pooled line + the new pod's request + the batch pod's
    reserved, _ = loads.node_line("a", high_priority=True)
    assert reserved[0] == pytest.approx(3.0 + 1.0)  # the batch pod borrows: it is not in the reservation
    state = loads.states["a"]
    assert state.limit["cpu"] == 3.0  # high-priority requests now: old 2 + new 1 (the batch pod borrows)
    assert state.long_term["cpu"] == pytest.approx(3.5 + 1.0)
    assert {p.pod: p.priority_class for p in state.pods} == {
        "old": "koord-prod",
        "new": "koord-prod",
        "spare": "koord-batch",
    }


def test_reclaimable_now_fresh_and_stale() -> None:
    fresh = node_reclaimable(view(AS_OF), "a", "cpu", AS_OF + 60, COLOCATION)
    assert fresh is not None and not fresh.stale
    # room = 10 - 1; the high-priority line over the window is 4 (pooled 3 + new pod 1)
    assert fresh.batch == pytest.approx(5.0)
    assert fresh.mid == pytest.approx(9.0 - 4.5)
    # Koordinator's CPU has no "request" policy; its mid: the long-term line 3.5 x 1.1 is above the requests 3
    assert fresh.koordinator == {"usage": pytest.approx(4.0), "max_usage_request": pytest.approx(3.0), "mid": 0.0}
    memory = node_reclaimable(view(AS_OF), "a", "memory", AS_OF + 60, COLOCATION)
    assert memory is not None and set(memory.koordinator) == {"usage", "request", "max_usage_request", "mid"}
    # within the forecast's horizon a stale measurement only stops flooring the offer: a rise to 9 measured then
    # would cap batch at 0 while fresh; an hour later the forecast alone carries it, with the forecast-only margin
    # (20 % of 10): 10 - 2 - 4
    risen = view(AS_OF)
    assert risen.states["a"].forecast is not None and risen.states["a"].forecast.cpu is not None
    risen.states["a"].forecast.cpu.last_usage = 8.5
    floored = node_reclaimable(risen, "a", "cpu", AS_OF + 60, COLOCATION)
    later = node_reclaimable(risen, "a", "cpu", AS_OF + 3600, COLOCATION)
    assert floored is not None and later is not None and not later.stale
    assert floored.batch == 0.0 and later.batch == pytest.approx(4.0)
    assert later.mid == pytest.approx(8.0 - 4.5)
    assert later.koordinator["usage"] == 0.0  # Koordinator drops batch to 0 without fresh metrics
    # an hour past the forecast's horizon: half the trust, halfway to the request-based value (room 8 - requests 8 + 1)
    stale = node_reclaimable(view(AS_OF, old_request="8"), "a", "cpu", AS_OF + DAY + 3600, COLOCATION)
    assert stale is not None and stale.stale
    assert stale.batch == pytest.approx(0.5 * 4.0 + 0.5 * 0.0)


def test_node_metadata_for_koordinator() -> None:
    loads = view(AS_OF)
    settings = COLOCATION.model_copy(update={"write_reclaim_ratios": True, "write_usage_thresholds": True})
    existing = node(
        "a",
        cpu="10",
        memory="16Gi",
        annotations={k.USAGE_THRESHOLDS_ANNOTATION: '{"prodUsageThresholds": {"cpu": 50}}'},
    )
    found = node_metadata(loads, existing, AS_OF + 60, settings, ExtenderSettings())
    assert found is not None
    labels, annotations = found
    # flat forecast: headroom = reclaim-ratio margin 1 + the largest rise of the week 0.8 (not the p99 0.5) of capacity 10
    assert labels == {
        colocation.NODE_RECLAIM_LABEL["cpu"]: "0.82",
        colocation.NODE_RECLAIM_LABEL["memory"]: labels[colocation.NODE_RECLAIM_LABEL["memory"]],
    }
    written = json.loads(annotations[k.USAGE_THRESHOLDS_ANNOTATION])
    # the forecast peak 4 is 2 cores above the usage 2: 65 % - 20 %
    assert written == {
        "prodUsageThresholds": {"cpu": 50},
        "usageThresholds": {"cpu": 45, "memory": written["usageThresholds"]["memory"]},
    }
    assert node_metadata(loads, node("elsewhere"), AS_OF, settings, ExtenderSettings()) is None
    # a version stored before largest_jump existed: the rise allowance stands in for it
    assert loads.states["a"].forecast is not None and loads.states["a"].forecast.cpu is not None
    loads.states["a"].forecast.cpu.largest_jump = None
    older = node_metadata(loads, existing, AS_OF + 60, settings, ExtenderSettings())
    assert older is not None and older[0][colocation.NODE_RECLAIM_LABEL["cpu"]] == "0.85"


def test_written_thresholds_are_not_counted_twice_by_the_extender() -> None:
    """The writer lowers the operator's threshold by the forecast rise; the extender, which adds that rise itself,
    must keep judging against the operator's threshold, and a second pass must not lower it again."""
    settings = COLOCATION.model_copy(update={"write_usage_thresholds": True})
    operator = {k.USAGE_THRESHOLDS_ANNOTATION: '{"usageThresholds": {"cpu": 60}}'}
    first = node_metadata(
        view(AS_OF), node("a", cpu="10", memory="16Gi", annotations=operator), AS_OF + 60, settings, ExtenderSettings()
    )
    assert first is not None
    _, written = first
    # the operator's 60 % minus the rise 4 - 2 = 2 cores of 10 (20 %); memory from the default 95 % minus the new
    # pod's default 200 MiB of 16 GiB (1.2 %)
    assert json.loads(written[k.USAGE_THRESHOLDS_ANNOTATION])["usageThresholds"] == {"cpu": 40, "memory": 94}
    assert json.loads(written[k.WRITTEN_THRESHOLDS_ANNOTATION]) == {
        "written": {"cpu": 40, "memory": 94},
        "operator": {"cpu": 60.0},
    }
    patched = node("a", cpu="10", memory="16Gi", annotations=written)
    capacity = node_capacity(patched, ExtenderSettings())
    assert capacity is not None and (capacity.cpu_threshold_percent, capacity.memory_threshold_percent) == (60.0, 95.0)
    second = node_metadata(view(AS_OF), patched, AS_OF + 60, settings, ExtenderSettings())
    assert second is not None and second[1] == written  # idempotent: the same values, not 40 - 20


def test_training_with_placement_stores_and_continues_the_node_model(tmp_path: Path) -> None:
    from cli.settings import Settings
    from models.settings import StoreSettings
    from models.store import ModelStore
    from pipelines.train import train_from_file

    usage = alternating(days=4)
    usage.sort_values(["namespace", "workload", "pod", "container", "timestamp"]).to_csv(
        tmp_path / "usage.csv", index=False
    )
    settings = Settings(forecast=FAST, store=StoreSettings(path=tmp_path / "store"))
    cut = int(usage["timestamp"].min()) + 3 * DAY
    first = train_from_file(tmp_path / "usage.csv", settings, as_of=cut)
    assert first.row_counts["nodes"] == 2 and "nodes.joblib" in first.files
    store = ModelStore(settings.store.path)
    assert {n.node for n in store.load().recommendations.nodes} == {"a", "b"}
    continued = train_from_file(tmp_path / "usage.csv", settings, incremental=True)
    model = store.load_node_model(continued.version)
    assert model is not None and model.data_end_ == int(usage["timestamp"].max())
    (tmp_path / "store" / "versions" / continued.version / "nodes.joblib").write_bytes(b"tampered")
    with pytest.raises(ModelStoreError, match="checksum"):
        store.load_node_model(continued.version)
