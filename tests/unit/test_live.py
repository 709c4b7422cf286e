"""The live loop's parts that need no Prometheus: the model's light update (exact histograms, no refit, fast up),
the store's light updates and checkpoint, `serve`'s reload following them, and where a restart resumes."""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.settings import Settings
from models.nodes import newest_node_usage
from models.settings import StoreSettings
from models.store import LIVE, ModelStore
from models.workload import WorkloadRecommender
from pipelines.live import LiveLoop, LoopState, with_live_usage
from pipelines.prometheus import PrometheusClient
from pipelines.settings import LiveSettings, PrometheusSettings
from recommender import colocation
from recommender.errors import ModelStoreError
from recommender.placement import NodeLoads, Reclaimable, node_reclaimable
from recommender.resources import NodeForecast
from recommender.units import GIB
from serving.settings import ExtenderSettings
from serving.state import ServiceState
from tests.conftest import make_usage
from tests.k8s import node
from tests.unit.test_nodes import AS_OF, COLOCATION, TIMELINE, forecast_of
from tests.unit.test_store import publish

DAY = 86400


@pytest.fixture(scope="module")
def history() -> pd.DataFrame:
    return make_usage(workloads=2, pods=1, days=3)


@pytest.fixture(scope="module")
def fitted(history: pd.DataFrame) -> WorkloadRecommender:
    end = int(history["timestamp"].max()) - 3600
    return WorkloadRecommender().fit(history[history["timestamp"] <= end])


def newer(history: pd.DataFrame, fitted: WorkloadRecommender) -> pd.DataFrame:
    return history[history["timestamp"] > fitted.data_end_]


def test_a_live_update_continues_the_histograms_as_partial_fit_does_without_refitting(
    history: pd.DataFrame, fitted: WorkloadRecommender
) -> None:
    rows = newer(history, fitted)
    refit, live = copy.deepcopy(fitted).partial_fit(rows), copy.deepcopy(fitted)
    chosen = {k: f.short_term.choice_.copy() for k, f in live.cpu_forecasts_.items()}
    profiles = {k: f.short_term.fitted_ for k, f in live.cpu_forecasts_.items()}
    # Minute by minute: one update per step gives the histograms of one partial_fit of them all.
    for t in sorted(rows["timestamp"].unique()):
        live.live_update(rows[rows["timestamp"] == t])
    np.testing.assert_allclose(live.cpu_histogram_.weights(), refit.cpu_histogram_.weights(), rtol=1e-12)
    assert live.memory_histogram_.peaks_.equals(refit.memory_histogram_.peaks_)
    np.testing.assert_allclose(live.cpu_grid_, refit.cpu_grid_, equal_nan=True)
    assert live.data_end_ == refit.data_end_
    for key, forecast in live.cpu_forecasts_.items():
        np.testing.assert_array_equal(forecast.short_term.choice_, chosen[key])
        assert forecast.short_term.fitted_ is profiles[key], "the forecast models must not be refitted"
        assert forecast.recent_end == live.grid_end_


def test_a_step_up_lifts_the_short_term_line_and_the_request_at_once_and_an_oom_kill_the_memory(
    history: pd.DataFrame, fitted: WorkloadRecommender
) -> None:
    end = fitted.data_end_
    before = fitted.predict(as_of=end + 301)
    rows = history[history["workload"] == "w0"].tail(1)
    jumped = pd.concat([rows.assign(timestamp=end + 300 * i, cpu_cores=3.0) for i in (1, 2)], ignore_index=True)
    live = copy.deepcopy(fitted).live_update(jumped)
    after = live.predict()
    old = next(r for r in before.recommendations if r.workload == "w0")
    new = next(r for r in after.recommendations if r.workload == "w0")
    assert old.cpu is not None and new.cpu is not None
    assert old.cpu.short_term[0] < 2.0 and old.cpu.target < 2.0
    assert new.cpu.short_term[0] >= 3.0 and new.cpu.target >= 3.0
    other = next(r for r in after.recommendations if r.workload == "w1")
    assert other.cpu == next(r for r in live.predict().recommendations if r.workload == "w1").cpu
    kill = rows.assign(timestamp=end + 700)[["timestamp", "namespace", "workload", "pod", "container"]]
    killed = copy.deepcopy(live).live_update(jumped.assign(timestamp=end + 900), oom_events=kill)
    rec = next(r for r in killed.predict().recommendations if r.workload == "w0")
    assert rec.history.oom_kills == 1
    assert rec.memory is not None and new.memory is not None and rec.memory.target > 1.1 * new.memory.target


@settings(max_examples=40, deadline=None)
@given(gap_steps=st.integers(min_value=0, max_value=4 * 288))
def test_without_a_live_update_the_lines_are_those_of_the_fitted_grid_at_any_gap(gap_steps: int) -> None:
    """The live seam leaves a stored model's lines as they were: a decision `gap_steps` after the grid's end reads
    the daily-repeating profile at that place, with the fast-up head only right after the end."""
    model = _small_model()
    forecast = next(iter(model.cpu_forecasts_.values()))
    step = 300
    as_of = forecast.grid_end + gap_steps * step
    short, request, long_term = forecast.lines(as_of, DAY, step)
    cut = gap_steps if gap_steps < 288 else 288 + gap_steps % 288
    expected = forecast.short_term.predict(cut + 288)[:, cut:]
    np.testing.assert_allclose(short, expected, equal_nan=True)
    np.testing.assert_allclose(request, forecast.request.predict(cut + 1)[:, -1], equal_nan=True)
    np.testing.assert_allclose(long_term, forecast.long_term.predict(cut + 1)[:, -1], equal_nan=True)


_MODEL: list[WorkloadRecommender] = []


def _small_model() -> WorkloadRecommender:
    if not _MODEL:
        _MODEL.append(WorkloadRecommender().fit(make_usage(workloads=2, pods=1, days=2)))
    return _MODEL[0]


def test_light_updates_are_numbered_checked_pruned_and_followed_by_serve(
    tmp_path: Path, fitted: WorkloadRecommender
) -> None:
    store = ModelStore(tmp_path)
    version = publish(store, fitted)
    state = ServiceState(store)
    assert state.refresh_if_published() and state.require().live is None
    assert state.require().revision == version
    recs = fitted.predict()
    updates = [store.publish_live(recs, version=version, last_sample=i, retained=2, writer="a") for i in (1, 2, 3)]
    assert [u.sequence for u in updates] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / LIVE).glob("*.json.gz")) == [u.file for u in updates[1:]]
    assert store.load_live(updates[-1]) == recs
    assert state.refresh_if_published(), "a new update is picked up at the next poll"
    assert state.require().revision == f"{version}+live.3" and state.require().live == updates[-1]
    assert not state.refresh_if_published(), "and not reloaded while it stays the newest"
    # A corrupt update leaves the lines served as they were, and says why.
    broken = store.publish_live(recs, version=version, last_sample=4, writer="a")
    (tmp_path / LIVE / broken.file).write_bytes(b"not gzip")
    assert not state.refresh_if_published()
    assert state.require().revision == f"{version}+live.3" and "checksum" in (state.live_error or "")
    # A new version replaces the live lines of the old one until the loop continues it.
    newer_version = publish(store, fitted)
    assert state.refresh_if_published() and state.require().revision == newer_version
    store.publish_live(recs, version=version, last_sample=5)  # a late update of the old version is ignored
    assert not state.refresh_if_published() and state.require().live is None


def test_a_broken_pointer_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / LIVE).mkdir()
    (tmp_path / LIVE / "latest").write_text("{")
    with pytest.raises(ModelStoreError, match="live/latest: not a live update pointer"):
        ModelStore(tmp_path).live_update()


def test_a_restart_resumes_from_a_recent_checkpoint_of_the_latest_version_only(
    tmp_path: Path, fitted: WorkloadRecommender
) -> None:
    store = ModelStore(tmp_path)
    version = publish(store, fitted)
    settings = Settings(store=StoreSettings(path=str(tmp_path)), live=LiveSettings(max_gap_seconds=DAY))
    now = fitted.data_end_ + 600.0
    loop = LiveLoop(settings, store, clock=lambda: now)
    fresh = loop.resume(now)
    step = settings.prometheus.step_seconds
    # The version's newest sample (at 200 s into a 5-minute step here) ends the step holding it: the first read
    # begins on the step grid, where every later read and any re-read of the same steps evaluates.
    assert fitted.data_end_ % step and fresh.last_sample % step == 0
    assert fresh.version == version and fresh.last_sample == fitted.data_end_ // step * step
    saved = LoopState(version, fitted, fitted.data_end_ + 300, DAY, [], {})
    store.write_live_checkpoint(saved)
    assert loop.resume(now).last_sample == fitted.data_end_ + 300
    # Older than the longest gap it replays: the version again, read back at most that far.
    late = fitted.data_end_ + 3 * DAY
    resumed = loop.resume(late)
    assert resumed.last_sample == (late - DAY) // step * step
    # A checkpoint of another version: the new version is what it would have continued.
    publish(store, fitted)
    assert loop.resume(now).version != version
    (tmp_path / LIVE / "checkpoint.joblib").write_bytes(b"garbage")
    assert store.load_live_checkpoint() is None


def test_a_new_version_keeps_the_live_calibration_of_the_state_it_replaces(tmp_path: Path) -> None:
    """The loop that follows a new version, or restarts from a checkpoint of the one before, carries the live line's
    calibration over (`continue_calibration`): a version starts at factor 1, and one comes every day. A state older
    than the longest gap the loop replays carries nothing."""
    usage = make_usage(workloads=3, pods=1, days=5)
    end = int(usage["timestamp"].max())
    old = WorkloadRecommender().fit(usage[usage["timestamp"] < end - 7200])
    hour = usage[(usage["timestamp"] >= end - 7200) & (usage["timestamp"] < end - 3600)]
    old.live_update(hour.assign(cpu_cores=hour["cpu_cores"] * 5))
    assert old.cpu_live_scale_.fleet > 0
    store = ModelStore(tmp_path)
    first = publish(store, old)
    publish(store, WorkloadRecommender().fit(usage[usage["timestamp"] < end - 3600]))
    settings = Settings(store=StoreSettings(path=str(tmp_path)), live=LiveSettings(max_gap_seconds=DAY))
    now = float(end)
    loop = LiveLoop(settings, store, clock=lambda: now)
    replaced = LoopState(first, old, old.data_end_, DAY, [], {})

    def fleet_factor(state: LoopState) -> float:
        assert isinstance(state.model, WorkloadRecommender)
        return float(state.model.cpu_live_scale_.fleet)

    assert fleet_factor(loop.resume(now)) == 0.0  # no state before it: the version as fitted
    assert fleet_factor(loop.resume(now, replaced=replaced)) == pytest.approx(old.cpu_live_scale_.fleet)
    store.write_live_checkpoint(replaced)  # a restart after the new version came out
    assert fleet_factor(loop.resume(now)) == pytest.approx(old.cpu_live_scale_.fleet)
    assert fleet_factor(loop.resume(now + 2 * DAY, replaced=replaced)) == 0.0


def test_live_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="interval_seconds"):
        LiveSettings(interval_seconds=0)
    assert LiveSettings().interval_seconds == 60 and LiveSettings().lease_duration_seconds == 15


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_any_pointer_either_reads_or_is_refused_with_a_store_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    """`serve` polls the pointer every second: whatever a broken disk or a stray writer leaves there, the answer is an
    update or a ModelStoreError naming the file (the previous lines then stay served), never another exception."""
    root = tmp_path_factory.mktemp("pointer")
    (root / LIVE).mkdir()
    (root / LIVE / "latest").write_bytes(data)
    try:
        update = ModelStore(root).live_update()
    except ModelStoreError as error:
        assert "live/latest" in str(error)
    else:
        assert update is not None and update.sequence >= 1


def _read(at: int, cpu_cores: dict[str, float], node: str = "a", priority: str = "koord-prod") -> pd.DataFrame:
    """A live read's usage rows at `at`: one container per pod, 1 GiB each, a 0.7-core / 2 GiB request."""
    return pd.DataFrame(
        {
            "timestamp": at,
            "namespace": "ns",
            "workload": list(cpu_cores),
            "pod": list(cpu_cores),
            "container": "main",
            "node": node,
            "priority_class": priority,
            "cpu_cores": list(cpu_cores.values()),
            "memory_bytes": float(GIB),
            "cpu_request_cores": 0.7,
            "memory_request_bytes": 2.0 * GIB,
        }
    )


def _room(nodes: list[NodeForecast], resource: str, now: float) -> Reclaimable:
    loads = NodeLoads.build(
        [], [node("a", cpu="10", memory="16Gi")], lambda key: None, TIMELINE, ExtenderSettings(), {"a": nodes[0]}
    )
    found = node_reclaimable(loads, "a", resource, now, COLOCATION)
    assert found is not None
    return found


def test_a_nodes_room_follows_a_step_in_its_pods_live_usage_within_one_update() -> None:
    """Each pass measures the node's pooled high-priority usage from its read (a pod without a sample at the newest
    step at its request, borrowing pods left out) and the served room is `live_reclaimable` of it; once the
    measurement is older than fresh_seconds the forecast-only value is served again."""
    version = [forecast_of(AS_OF - 600)]
    t0, t1 = AS_OF + 60, AS_OF + 120
    first = pd.concat([_read(t0, {"p1": 1.0, "p2": 0.5, "p3": 0.2}), _read(t0, {"spare": 3.0}, priority="koord-batch")])
    nodes = with_live_usage(version, newest_node_usage(first))
    # p1 steps up; p3 has no sample at the newest step of this read: counted at its 0.7-core request.
    second = pd.concat([_read(t1, {"p1": 4.0, "p2": 0.5}), _read(t1 - 30, {"p3": 0.2})])
    stepped = with_live_usage(nodes, newest_node_usage(second))
    assert nodes[0].live_sample == t0 and stepped[0].live_sample == t1
    assert nodes[0].cpu is not None and nodes[0].cpu.live_usage == pytest.approx(1.7)
    assert stepped[0].cpu is not None and stepped[0].cpu.live_usage == pytest.approx(5.2)
    assert stepped[0].memory is not None and stepped[0].memory.live_usage == pytest.approx(4.0 * GIB)
    assert version[0].cpu is not None and version[0].cpu.live_usage is None, "the version's lines stay untouched"
    cpu = COLOCATION.of("cpu")
    short_term, long_term, rise = 3.0, 3.5, 0.8  # forecast_of's lines and largest 5-minute rise

    def expected(level: float, cap: float) -> float:
        cap = cap if cpu.live_forecast_cap else np.nan
        return float(colocation.live_reclaimable(10.0, 10.0 * cpu.live_margin_fraction, 0.0, 0.0, level, rise, cap))

    before, after = _room(nodes, "cpu", t0 + 30), _room(stepped, "cpu", t1 + 30)
    assert before.policy == after.policy == "live" and not after.stale
    assert before.batch == pytest.approx(expected(1.7, short_term)) and before.mid == pytest.approx(
        expected(1.7, long_term)
    )
    assert after.batch == pytest.approx(expected(5.2, short_term)) and after.mid == pytest.approx(
        expected(5.2, long_term)
    )
    assert after.batch < before.batch - 2.5, "the step of 3 cores (less the rise the live room already kept) is taken"
    assert after.koordinator["usage"] == pytest.approx(10.0 * COLOCATION.koordinator_cpu_reclaim_percent / 100 - 5.2)
    memory = _room(stepped, "memory", t1 + 30)
    assert memory.batch == pytest.approx(
        float(
            colocation.live_reclaimable(
                16.0 * GIB, 16.0 * GIB * COLOCATION.of("memory").live_margin_fraction, 0.0, 0.0, 4.0 * GIB, 0.0, np.nan
            )
        )
    )
    stale = _room(stepped, "cpu", t1 + COLOCATION.fresh_seconds + 1)
    assert stale.policy == "forecast"
    assert stale.batch == _room(version, "cpu", t1 + COLOCATION.fresh_seconds + 1).batch
    # A node the read does not cover keeps its lines (its last live usage ages out by fresh_seconds).
    assert with_live_usage(stepped, newest_node_usage(_read(t1 + 60, {"q": 1.0}, node="b"))) == stepped


@settings(max_examples=50, deadline=None)
@given(
    usage=st.lists(st.one_of(st.none(), st.floats(0, 64)), min_size=1, max_size=6),
    requests=st.lists(st.floats(0, 8), min_size=6, max_size=6),
)
def test_the_live_node_usage_is_koordinators_usage_sum_at_the_newest_step(
    usage: list[float | None], requests: list[float]
) -> None:
    """Any mix of pods with and without a sample at the node's newest step: the pooled value is the sum of each
    one's sample there, else its request (`colocation.koordinator_hp_used`, the backtest's rule)."""
    at = AS_OF
    rows = []
    for index, value in enumerate(usage):
        row = _read(at if value is not None else at - 60, {f"p{index}": 0.0 if value is None else value})
        rows.append(row.assign(cpu_request_cores=requests[index]))
    rows.append(_read(at, {"anchor": 0.0}).assign(cpu_request_cores=0.0))
    found = newest_node_usage(pd.concat(rows, ignore_index=True))["a"]
    assert found.sample == at
    want = sum(requests[i] if v is None else v for i, v in enumerate(usage))
    assert found.cpu_cores == pytest.approx(want)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [([1_000_000_123.4, 1_000_000_101.0], 1_000_000_100), ([], 1_000_000_500)],
)
def test_a_step_is_read_only_up_to_the_newest_time_every_scrape_is_written_past(
    tmp_path: Path, answer: list[float], expected: int
) -> None:
    def prometheus(request: httpx.Request) -> httpx.Response:
        form = dict(httpx.QueryParams(request.content.decode()))
        assert form["query"] == "min(timestamp(up))" and form["time"] == "1000000500"
        result = [{"metric": {"job": str(i)}, "value": [1_000_000_500, str(v)]} for i, v in enumerate(answer)]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    settings = Settings(prometheus=PrometheusSettings(url="http://prometheus.test", step_seconds=20))
    loop = LiveLoop(settings, ModelStore(tmp_path))
    with PrometheusClient(settings.prometheus, transport=httpx.MockTransport(prometheus)) as client:
        # The slowest target's newest written scrape bounds the read, on the step grid; no `up` at all: no bound.
        assert loop._watermark(client, 1_000_000_500.7) == expected
