"""The live pass's cheaper parts give what the general ones give: the usage grid slid in place, the recommendations
built without validation, the line names and qualities carried between passes, the LZ4 checkpoint."""

from __future__ import annotations

import copy
import gzip
import pickle
from dataclasses import replace
from hashlib import sha256
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from models.ensemble import history_summary
from models.pods import with_group_labels
from models.store import LIVE, LIVE_CHECKPOINT, ModelStore
from models.workload import _SPARE, WorkloadRecommender, _Block
from recommender.errors import ModelStoreError
from recommender.resources import CurrentResources, History, LineModels, Peak, RecommendationSet
from recommender.trusted import constructor
from tests.conftest import make_usage

STEP = 300


@pytest.fixture(scope="module")
def history() -> pd.DataFrame:
    return make_usage(workloads=3, pods=2, days=3, seed=4)


@pytest.fixture(scope="module")
def fitted(history: pd.DataFrame) -> WorkloadRecommender:
    return WorkloadRecommender().fit(history[history["timestamp"] <= history["timestamp"].max() - 6 * 3600])


def _general_slide(before: WorkloadRecommender, after: WorkloadRecommender, usage: pd.DataFrame, name: str) -> Any:
    """The slide as `_continue` does it for a grid whose rows or width change: a new NaN grid, the old columns
    copied to their new place, `np.fmax` with a grid of the usage over the whole width."""
    old = getattr(before, name)
    width = old.shape[1]
    shift = min((after.grid_end_ - before.grid_end_) // STEP, width)
    slid = np.full(old.shape, np.nan)
    slid[:, : width - shift] = old[:, shift:]
    column = "cpu_cores" if name == "cpu_grid_" else "memory_bytes"
    groups = pd.Index(after.forecast_groups_)
    return np.fmax(slid, after._usage_grid(with_group_labels(usage), column, groups))


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=6, unique=True),
    pods=st.lists(st.sampled_from([f"w{w}-p{p}" for w in range(3) for p in range(2)]), min_size=1, unique=True),
    late=st.integers(min_value=0, max_value=700),
    cpu=st.floats(min_value=0.0, max_value=64.0) | st.just(float("nan")),
)
def test_a_grid_slid_in_place_is_the_general_slide(
    history: pd.DataFrame, fitted: WorkloadRecommender, steps: list[int], pods: list[str], late: int, cpu: float
) -> None:
    """Any new steps (gaps between them, some pods only, a sample late in its step, a NaN): the same grids."""
    last = history[history["timestamp"] == history["timestamp"].max()]
    rows = last[last["pod"].isin(pods)]
    end = fitted.data_end_
    usage = pd.concat(
        [rows.assign(timestamp=end + STEP * k + late % STEP, cpu_cores=cpu * k / 30) for k in steps],
        ignore_index=True,
    )
    live = copy.deepcopy(fitted).live_update(usage)
    for name in ("cpu_grid_", "memory_grid_"):
        np.testing.assert_array_equal(getattr(live, name), _general_slide(fitted, live, usage, name))


def _same_types(built: Any, validated: Any, where: str = "") -> None:
    """Equal values of the very same Python types, all the way down (a numpy float or an int in a float field
    would serialise, or compare, otherwise than what validation gives)."""
    assert type(built) is type(validated), f"{where}: {type(built).__name__} != {type(validated).__name__}"
    if isinstance(built, dict):
        assert list(built) == list(validated), where
        for key in built:
            _same_types(built[key], validated[key], f"{where}.{key}")
    elif isinstance(built, list):
        assert len(built) == len(validated), where
        for index, (a, b) in enumerate(zip(built, validated)):
            _same_types(a, b, f"{where}[{index}]")
    elif isinstance(built, BaseModel):
        for key in type(built).model_fields:
            _same_types(getattr(built, key), getattr(validated, key), f"{where}.{key}")
    else:
        assert built == validated or (built != built and validated != validated), where


def _revalidated(recommendations: RecommendationSet) -> RecommendationSet:
    return RecommendationSet.model_validate_json(recommendations.model_dump_json())


@pytest.mark.parametrize("policy", ["forecast", "vpa"])
def test_predict_builds_what_validating_its_values_gives(
    history: pd.DataFrame, fitted: WorkloadRecommender, policy: str
) -> None:
    """Fitted, live-updated (fresh and a container gone stale), and under the `vpa` policy."""
    model = fitted if policy == "forecast" else WorkloadRecommender(request_policy="vpa").fit(history)
    later = history[history["timestamp"] > model.data_end_]
    live = copy.deepcopy(model).live_update(
        later if len(later) else history.tail(6).assign(timestamp=model.data_end_ + STEP)
    )
    for recommendations in (model.predict(), live.predict(), live.predict(as_of=live.data_end_ + 2 * 86400)):
        again = _revalidated(recommendations)
        assert again.model_dump_json() == recommendations.model_dump_json()
        _same_types(recommendations, again)


def test_a_live_passs_carried_line_names_and_qualities_are_those_predict_computes(
    history: pd.DataFrame, fitted: WorkloadRecommender
) -> None:
    live = copy.deepcopy(fitted).live_update(history[history["timestamp"] > fitted.data_end_])
    assert all(f.descriptions is not None for f in live.cpu_forecasts_.values())
    fresh = copy.deepcopy(live)
    for name in ("cpu_forecasts_", "memory_forecasts_"):
        setattr(fresh, name, {k: replace(f, descriptions=None) for k, f in getattr(fresh, name).items()})
    assert live.predict().model_dump_json() == fresh.predict().model_dump_json()


def _grid(store: ModelStore) -> Any:
    loaded = store.load_live_checkpoint()
    assert loaded is not None
    return loaded["grid"]


def test_the_checkpoint_is_lz4_and_an_older_zlib_one_still_resumes(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    state = {"grid": np.arange(10_000, dtype=np.float64)}
    store.write_live_checkpoint(state)
    assert (tmp_path / LIVE / LIVE_CHECKPOINT).read_bytes()[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    np.testing.assert_array_equal(_grid(store), state["grid"])
    store.files.put_model(store._live(LIVE_CHECKPOINT), state, compress=1)
    assert (tmp_path / LIVE / LIVE_CHECKPOINT).read_bytes()[:1] == b"\x78"  # zlib
    np.testing.assert_array_equal(_grid(store), state["grid"])


def _summary_by_masking(grid: Any, recent_steps: int) -> Any:
    """`history_summary` as it was: the unknown steps masked to -inf in a copy of the grid, then maxima."""
    known_mask = ~np.isnan(grid)
    with np.errstate(all="ignore"):
        masked = np.where(known_mask, grid, -np.inf)
        recent = masked[:, -recent_steps:].max(axis=1) if grid.shape[1] else np.full(grid.shape[0], -np.inf)
        observed = masked.max(axis=1) if grid.shape[1] else np.full(grid.shape[0], -np.inf)
    since = np.where(known_mask.any(axis=1), np.argmax(known_mask[:, ::-1], axis=1), grid.shape[1])
    return np.stack(
        [
            np.where(np.isfinite(recent), recent, np.nan),
            np.where(np.isfinite(observed), observed, np.nan),
            known_mask.sum(axis=1).astype(np.float64),
            since.astype(np.float64),
        ],
        axis=1,
    )


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(min_value=0, max_value=5),
    columns=st.integers(min_value=1, max_value=40),
    recent_steps=st.integers(min_value=0, max_value=50),
    values=st.lists(
        st.floats(min_value=0.0, max_value=1e12) | st.sampled_from([float("nan"), float("inf"), -float("inf")]),
        min_size=200,
        max_size=200,
    ),
)
def test_the_history_summary_is_the_masked_one(rows: int, columns: int, recent_steps: int, values: list[float]) -> None:
    grid = np.resize(np.asarray(values), rows * columns).reshape(rows, columns)
    np.testing.assert_array_equal(history_summary(grid, recent_steps), _summary_by_masking(grid, recent_steps))


def _continued(tmp_path: Path, name: str, scale: dict[str, Any], later: pd.DataFrame, as_of: int) -> Any:
    """The live loop over a version of the bundled data trained up to `as_of` (`scale`: how it is partitioned),
    after one pass per 5-minute step of `later`: the loop and its last update."""
    from cli.settings import Settings
    from models.settings import StoreSettings
    from pipelines.live import LiveLoop
    from pipelines.settings import LiveSettings
    from pipelines.train import train_from_file
    from tests.conftest import BUNDLED

    settings = Settings(
        forecast={},
        scale=scale,
        store=StoreSettings(path=tmp_path / name),
        live=LiveSettings(leader_election=False, metrics_port=None),
    )
    train_from_file(BUNDLED, settings, as_of=as_of)
    loop = LiveLoop(settings, ModelStore(tmp_path / name), clock=lambda: float(as_of + 3 * STEP))
    loop.state = loop.resume(float(as_of + 3 * STEP))
    update = None
    for t in sorted(later["timestamp"].unique()):
        rows = later[later["timestamp"] == t].reset_index(drop=True)
        update = loop.apply(rows, rows.iloc[:0], int(t), {}, {})
    return loop, update


def _bundled_steps(as_of: int) -> pd.DataFrame:
    from tests.conftest import BUNDLED

    usage = pd.read_csv(BUNDLED)
    return usage[(usage["timestamp"] >= as_of) & (usage["timestamp"] < as_of + 3 * STEP)]


def test_a_version_fitted_in_partitions_is_continued_as_one(tmp_path: Path) -> None:
    """The streaming Prometheus path writes a fleet of more than `scale.partition_samples` in partitions: the loop
    continues each partition's model with its workloads' rows and publishes what one model continued gives."""
    from pipelines.live import PartitionedModel

    as_of = 1559347200
    later = _bundled_steps(as_of)
    published = []
    for name, scale in (("whole", {}), ("parts", {"partition_containers": 1})):
        loop, update = _continued(tmp_path, name, scale, later, as_of)
        assert isinstance(loop.state.model, PartitionedModel) == (name == "parts")
        assert update is not None
        published.append(loop.store.load_live(update))
    whole, parts = published
    assert len(parts.recommendations) == 4 and parts.as_of == whole.as_of
    assert [r.model_dump(mode="json") for r in parts.recommendations] == [
        r.model_dump(mode="json") for r in whole.recommendations
    ]


def test_a_fleet_fitted_in_partitions_moves_one_fleet_factor(tmp_path: Path) -> None:
    """A pass in which one partition's containers run far above their lines: every partition takes the fleet factor
    that model of the whole fleet takes from the same samples, and its lines in force carry it."""
    from pipelines.live import PartitionedModel

    as_of = 1559347200
    later = _bundled_steps(as_of)
    hot = later["workload"] == sorted(later["workload"].unique())[0]
    later = later.assign(cpu_cores=np.where(hot, later["cpu_cores"] * 5, later["cpu_cores"]))
    fleets = {}
    for name, scale in (("whole", {}), ("parts", {"partition_containers": 2})):
        model = _continued(tmp_path, name, scale, later, as_of)[0].state.model
        models = list(model.models.values()) if isinstance(model, PartitionedModel) else [model]
        assert (len(models) > 1) == (name == "parts")
        fleets[name] = [m.cpu_live_scale_.fleet for m in models]
        for m in models:
            groups = m.forecast_groups_.size
            np.testing.assert_allclose(m.cpu_live_issued_.factors, m.cpu_live_scale_.factors(groups), rtol=1e-12)
    assert fleets["whole"][0] > 0  # the hot workload's misses raised it
    assert fleets["parts"] == pytest.approx([fleets["whole"][0]] * len(fleets["parts"]), rel=1e-9)


@pytest.mark.parametrize(
    ("model", "values"),
    [
        (History, {"first_sample": 1, "last_sample": 2, "pods": 1, "replicas": 1, "samples": 3}),
        (LineModels, {"target": "t", "short_term": "s", "long_term": "l"}),
        (Peak, {"value": 1.5}),
        (CurrentResources, {}),
    ],
)
def test_a_trusted_constructor_builds_what_model_construct_builds(model: type[BaseModel], values: Any) -> None:
    """The same fields in the same order (the JSON's), the same fields set, defaults copied for each instance."""
    build = constructor(model)
    built, constructed = build(**values), model.model_construct(**values)
    assert built.__dict__ == constructed.__dict__ and list(built.__dict__) == list(constructed.__dict__)
    assert built.model_fields_set == constructed.model_fields_set
    assert built.model_dump_json() == constructed.model_dump_json()
    for name, value in built.__dict__.items():
        if isinstance(value, (list, dict)):
            assert value is not build(**values).__dict__[name], name
    with pytest.raises(TypeError, match="not fields"):
        build(**values, unknown=1)


def test_a_trusted_constructor_refuses_a_model_with_aliases() -> None:
    class Aliased(BaseModel):
        value: int = Field(alias="v")

    with pytest.raises(TypeError, match="Aliased"):
        constructor(Aliased)


@pytest.mark.parametrize("policy", ["forecast", "vpa"])
def test_a_light_update_is_gzip_of_the_sets_json_byte_for_byte(
    tmp_path: Path, history: pd.DataFrame, fitted: WorkloadRecommender, policy: str
) -> None:
    """orjson writes the recommendations and ISA-L compresses them, chunk by chunk: any gzip reader gets back
    exactly `model_dump_json` (fitted, live-updated, stale two days on, under the `vpa` policy), and serve reads it."""
    store = ModelStore(tmp_path)
    model = fitted if policy == "forecast" else WorkloadRecommender(request_policy="vpa").fit(history)
    live = copy.deepcopy(model).live_update(history[history["timestamp"] > model.data_end_])
    for sequence, recommendations in enumerate(
        (model.predict(), live.predict(), live.predict(as_of=live.data_end_ + 2 * 86400)), start=1
    ):
        update = store.publish_live(recommendations, version="v", last_sample=sequence)
        written = (tmp_path / LIVE / update.file).read_bytes()
        assert gzip.decompress(written) == recommendations.model_dump_json().encode()
        assert store.load_live(update) == recommendations


_ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-7, 1e16, 1e21, 5e-324])


@settings(max_examples=60, deadline=None)
@given(
    line=st.lists(_ANY_FLOAT | st.none(), max_size=20),
    target=_ANY_FLOAT,
    name=st.text(max_size=8),
)
def test_a_light_updates_recommendation_is_written_as_pydantic_writes_it(
    tmp_path_factory: pytest.TempPathFactory,
    fitted: WorkloadRecommender,
    line: list[float | None],
    target: float,
    name: str,
) -> None:
    """Any float (NaN, infinities, subnormal, exponents), None and text: orjson's JSON is pydantic's."""
    first = fitted.predict().recommendations[0]
    assert first.cpu is not None and first.history is not None
    odd = first.model_copy(
        update={
            "container": name,
            "cpu": first.cpu.model_copy(update={"target": target, "short_term": [x for x in line if x is not None]}),
            "history": first.history.model_copy(update={"recent_cpu_cores": line}),
        }
    )
    recommendations = RecommendationSet(as_of=1, horizon_seconds=300, step_seconds=300, recommendations=[odd])
    root = tmp_path_factory.mktemp("store")
    update = ModelStore(root).publish_live(recommendations, version="v", last_sample=1)
    written = gzip.decompress((root / LIVE / update.file).read_bytes())
    assert written == recommendations.model_dump_json().encode()


def test_a_light_update_that_is_not_gzip_is_refused_naming_the_file(
    tmp_path: Path, fitted: WorkloadRecommender
) -> None:
    store = ModelStore(tmp_path)
    update = store.publish_live(fitted.predict(), version="v", last_sample=1)
    path = tmp_path / LIVE / update.file
    for broken in (b"not gzip", path.read_bytes()[:-9], gzip.compress(b"{}")):
        path.write_bytes(broken)
        forged = update.model_copy(
            update={
                "entry": update.entry.model_copy(update={"bytes": len(broken), "sha256": sha256(broken).hexdigest()})
            }
        )
        with pytest.raises(ModelStoreError, match=f"{update.file}: not a valid recommendation set"):
            store.load_live(forged)


def test_grids_moved_over_spare_columns_pass_after_pass_are_the_general_slide(
    history: pd.DataFrame, fitted: WorkloadRecommender, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window moved over 3 spare columns, then back, pass after pass (one step, two, none), pickled and resumed
    halfway: each pass's grids are the general slide's of the pass before, and no pass copies the grid but those
    that move back."""
    monkeypatch.setattr(_SPARE, "columns", 3)
    last = history[history["timestamp"] == history["timestamp"].max()]
    live = copy.deepcopy(fitted)
    end = fitted.data_end_
    for index, gap in enumerate([1, 1, 2, 1, 0, 1, 1, 1, 3, 1, 1]):
        end += gap * STEP
        usage = last.assign(timestamp=end, cpu_cores=last["cpu_cores"] * (1 + index / 10))
        before = copy.deepcopy(live)
        if index == 5:
            live = pickle.loads(pickle.dumps(live))
        live.live_update(usage)
        for name in ("cpu_grid_", "memory_grid_"):
            np.testing.assert_array_equal(getattr(live, name), _general_slide(before, live, usage, name))
    assert live.cpu_grid_.base is not None and live.cpu_grid_.base.shape[1] == live.cpu_grid_.shape[1] + 3
    trained = copy.deepcopy(fitted).partial_fit(usage)
    assert trained.cpu_grid_.base is None, "a training's grid slides in place, without a wider copy"


@pytest.mark.parametrize(
    "fitted",
    [["a", "b", "c", "d"], ["d", "c", "b", "a"], ["b", "d"], ["a", "b", "c", "e"], [], ["a", "b", "c", "d", "e"]],
)
def test_a_blocks_positions_are_pandas_lookups_found_once_per_table(fitted: list[str]) -> None:
    """The same table in order needs no lookup; any other is pandas' `get_indexer` (-1: not there)."""
    everyone = pd.Index(["a", "b", "c", "d"], dtype="string[pyarrow]")
    table = np.asarray(fitted, dtype=str)
    memo: dict[str, Any] = {}
    expected = pd.Index(table).get_indexer(everyone)
    for rows in (slice(0, 2), slice(2, 4)):
        block = _Block(everyone, rows, memo)
        np.testing.assert_array_equal(block.positions(table), expected[rows])
    assert len([key for key in memo if key.startswith("positions.")]) == 1


_LABELS = st.sampled_from(["", "a", "b", "a\x00", '["x", "y"]', "é"]) | st.text(max_size=3)


@settings(max_examples=200, deadline=None)
@given(previous=st.lists(_LABELS, max_size=8), new=st.lists(_LABELS, max_size=8))
def test_united_labels_are_what_a_pandas_index_appended_and_searched_gives(previous: list[str], new: list[str]) -> None:
    """Any labels, repeated, NUL-ended (which numpy's strings drop) or new: the same labels, order and positions."""
    from models._validation import united_labels

    old = np.asarray(previous, dtype=str) if previous else np.zeros(0, dtype=str)
    labels = pd.Index(old, dtype=object).append(pd.Index(new, dtype=str)).unique()
    united, positions = united_labels(old, pd.Index(new, dtype=str))
    assert united.dtype.kind == "U" and united.tolist() == np.asarray(labels, dtype=str).tolist()
    assert positions.tolist() == labels.get_indexer(pd.Index(new, dtype=str)).tolist()


_NAMES = st.sampled_from(["a", "b", "ab", "a b", 'a"', "é", "a\\"])


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(st.tuples(_NAMES, _NAMES), min_size=1, max_size=30),
    starts=st.lists(st.tuples(_NAMES, _NAMES | st.just("*")), max_size=4, unique=True),
)
def test_a_passs_rows_go_to_the_partition_of_their_workload_in_their_order(
    rows: list[tuple[str, str]], starts: list[tuple[str, str]]
) -> None:
    """Each row goes to the last start at or before its workload in label order (a workload before every start to
    the first partition), and each partition's frame is the rows a mask of it gives, in their order."""
    from pipelines.live import PartitionedModel, _by_partition
    from pipelines.partitions import FIRST, label_key

    plan = [FIRST, *sorted(starts, key=label_key)]
    frame = pd.DataFrame(rows, columns=["namespace", "workload"]).assign(value=np.arange(len(rows)))
    frame.index = frame.index * 3 + 7  # labels that are not positions
    parts = PartitionedModel({}, plan)._partition_of(frame)
    keys = [label_key((namespace, workload)) for namespace, workload in rows]
    expected = [max((i for i, start in enumerate(plan) if label_key(start) <= key), default=0) for key in keys]
    assert parts.tolist() == expected
    split = _by_partition(frame, parts)
    assert sorted(split) == sorted(set(expected))
    for index, mine in split.items():
        pd.testing.assert_frame_equal(mine, frame[parts == index])
