"""The pieces that make partitioned training equal to the single-process fit: mergeable calibration sketches and
sample-step counts, and partitions of whole workloads in the order of the containers' labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.ensemble import SKETCH_RESOLUTION, merge_sketches, ratio_sketch, sketch_quantile
from models.forecast import nan_quantile
from models.pods import group_label
from models.workload import median_of_counts
from pipelines.partitions import assign_partitions, label_key, plan_partitions

ratios = st.lists(
    st.one_of(st.floats(0, 1e6, allow_subnormal=False), st.just(0.0), st.just(float("inf")), st.just(float("nan"))),
    min_size=1,
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(ratios, st.integers(1, 199), st.floats(0.5, 0.999))
def test_merged_sketches_equal_the_whole_and_its_quantile_is_close_above(
    values: list[float], cut: int, q: float
) -> None:
    data = np.asarray(values)
    whole = ratio_sketch(data)
    merged = merge_sketches([ratio_sketch(data[:cut]), ratio_sketch(data[cut:])])
    assert np.array_equal(whole[0], merged[0]) and np.array_equal(whole[1], merged[1])
    exact = float(nan_quantile(data.reshape(1, -1), q)[0])
    got = sketch_quantile(merged, q)
    if np.isnan(exact) or exact in (0.0, float("inf")):
        assert got == exact or (np.isnan(got) and np.isnan(exact))
    else:
        assert exact <= got <= exact * (1 + SKETCH_RESOLUTION) * (1 + 1e-12)


@given(st.lists(st.integers(1, 4000), min_size=1, max_size=60))
def test_median_of_counts_is_numpys_median(steps: list[int]) -> None:
    values, counts = np.unique(np.asarray(steps, dtype=np.int64), return_counts=True)
    assert median_of_counts(values, counts.astype(np.int64), default=60.0) == float(np.median(steps))
    assert median_of_counts(values[:0], counts[:0], default=60.0) == 60.0


@given(
    st.dictionaries(
        st.tuples(st.sampled_from(["a", "a b", 'a"', "ns", "é"]), st.text(min_size=1, max_size=4)),
        st.integers(1, 5),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 8),
)
def test_partitions_hold_whole_workloads_in_label_order(containers: dict[tuple[str, str], int], size: int) -> None:
    partitions = plan_partitions(containers, size)
    flat = [w for p in partitions for w in p.workloads]
    assert sorted(flat) == sorted(containers)
    assert all(p.containers <= size or len(p.workloads) == 1 for p in partitions)
    # Concatenating the partitions' sorted container labels gives the fleet's sorted labels.
    labels = [group_label(ns, wl, f"c{i}") for ns, wl in flat for i in range(containers[(ns, wl)])]
    per_partition = [
        sorted(group_label(ns, wl, f"c{i}") for ns, wl in p.workloads for i in range(containers[(ns, wl)]))
        for p in partitions
    ]
    assert [label for part in per_partition for label in part] == sorted(labels)


def test_our_errors_cross_process_boundaries_intact() -> None:
    """A task's error is pickled from the Dask worker to the driver: each keeps its fields and message."""
    import pickle

    from recommender.errors import DistributedTrainingError, InputFileError, PartialDataError, TrainingMemoryError

    for error in (
        InputFileError("usage.csv", "negative cpu_cores", line=7, column="cpu_cores"),
        PartialDataError({"team-a/*": "timeout"}),
        DistributedTrainingError({"partition 1 (a/b, 1 workloads)": "KilledWorker"}, 4, 0.0),
        TrainingMemoryError("usage.csv", 1_000_000, 1, "Unable to allocate 15.1 GiB"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)


@given(
    st.dictionaries(
        st.tuples(st.sampled_from(["a", "b", "ns"]), st.text("abc-", min_size=1, max_size=3)),
        st.integers(1, 3),
        min_size=1,
        max_size=20,
    ),
    st.dictionaries(
        st.tuples(st.sampled_from(["a", "b", "c", "ns"]), st.text("abc-", min_size=1, max_size=3)),
        st.integers(1, 3),
        max_size=10,
    ),
    st.integers(1, 6),
)
def test_a_recorded_plan_keeps_every_workload_in_its_partition(
    first: dict[tuple[str, str], int], later: dict[tuple[str, str], int], size: int
) -> None:
    """An incremental run assigns workloads by the parent's partition starts: the parent's workloads land where
    they were, new ones in the range they sort into, and the label order still concatenates."""
    plan = plan_partitions(first, size)
    assert plan[0].start == ("", "")
    again = assign_partitions({**first, **later}, [p.start for p in plan])
    assert len(again) == len(plan)
    for before, after in zip(plan, again, strict=True):
        assert set(before.workloads) <= set(after.workloads)
    flat = [w for p in again for w in p.workloads]
    assert flat == sorted(flat, key=label_key) and sorted(flat) == sorted({**first, **later})


def test_one_process_in_partitions_gives_the_recommendations_of_one_fit() -> None:
    """`scale.partition_containers` set for a run in this process: partition after partition on the in-process
    executor, the forecasts chosen on all partitions as one fleet: every recommendation equals one fit's."""
    from cli.settings import Settings
    from pipelines.train import recommend_from_file
    from tests.conftest import BUNDLED

    as_of = 1559347200
    whole = recommend_from_file(BUNDLED, as_of, 86400, Settings(forecast={}))
    parts = recommend_from_file(BUNDLED, as_of, 86400, Settings(forecast={}, scale={"partition_containers": 1}))
    expected = [r.model_dump(mode="json") for r in whole.recommendations]
    assert [r.model_dump(mode="json") for r in parts.recommendations] == expected
    assert len(expected) == 4
    lines = [r.cpu.models.quality for r in parts.recommendations if r.cpu.models is not None]
    for line in ("short_term", "target", "long_term"):
        assert len({round(q[line].calibration_factor, 4) for q in lines if line in q}) <= 1, line
    assert any(lines)


def test_a_fleet_too_big_for_the_process_memory_stops_with_one_line_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numpy's MemoryError anywhere in a run (issue 41: 1,000,000 containers ended in `Unable to allocate 15.1 GiB`
    and a traceback) becomes our error, exit code 10, naming the fleet and the way out; nothing is published."""
    from cli.settings import Settings
    from pipelines import train
    from recommender.errors import TrainingMemoryError
    from tests.conftest import BUNDLED

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError("Unable to allocate 15.1 GiB for an array with shape (1000000, 2021) and data type float64")

    monkeypatch.setattr(train, "fit_partition", out_of_memory)
    store = tmp_path / "store"
    with pytest.raises(TrainingMemoryError) as raised:
        train.train_from_file(BUNDLED, Settings(store={"path": store}))
    message = str(raised.value)
    assert "\n" not in message and raised.value.exit_code == 10
    assert message.startswith(f"{BUNDLED}: training 4 workload containers ran out of memory (Unable to allocate 15.1")
    assert "--workers" in message
    assert not list(store.glob("versions/*/manifest.json"))
