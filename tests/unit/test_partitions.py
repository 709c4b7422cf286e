"""The pieces that make partitioned training equal to the single-process fit: mergeable calibration sketches and
sample-step counts, and partitions of whole workloads in the order of the containers' labels."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from models.ensemble import SKETCH_RESOLUTION, merge_sketches, ratio_sketch, sketch_quantile
from models.forecast import nan_quantile
from models.workload import group_label, median_of_counts
from pipelines.partitions import plan_partitions

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

    from recommender.errors import DistributedTrainingError, InputFileError, PartialDataError

    for error in (
        InputFileError("usage.csv", "negative cpu_cores", line=7, column="cpu_cores"),
        PartialDataError({"team-a/*": "timeout"}),
        DistributedTrainingError({"partition 1 (a/b, 1 workloads)": "KilledWorker"}, 4, 0.0),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
