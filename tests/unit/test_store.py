"""The model store: atomic publish, latest pointer, retention, and refusal of corrupt or partial versions."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from models.nodes import NodeForecaster
from models.store import PUBLISHING, DataWindow, FileEntry, ModelStore, StoreFiles
from models.workload import WorkloadRecommender
from recommender.errors import ModelStoreError
from recommender.resources import RecommendationSet
from tests.conftest import make_usage

LZ4_MAGIC = b"\x04\x22\x4d\x18"


@pytest.fixture(scope="module")
def fitted() -> WorkloadRecommender:
    return WorkloadRecommender().fit(make_usage(workloads=2, pods=1, days=1))


def publish(store: ModelStore, model: WorkloadRecommender) -> str:
    """A version of `model`, its data window ending at the model's newest sample."""
    return store.publish(
        model.predict(),
        model,
        source="test",
        parameters={},
        row_counts={"usage_rows": 1},
        fit_metrics={},
        data_window=DataWindow(first_sample=0, last_sample=model.data_end_, as_of=model.data_end_ + 1),
    ).version


def test_publish_then_load(tmp_path: Path, fitted: WorkloadRecommender) -> None:
    store = ModelStore(tmp_path)
    name = publish(store, fitted)
    assert store.latest_name() == name
    loaded = store.load()
    assert loaded.manifest.version == name
    assert len(loaded.recommendations.recommendations) == 2
    assert isinstance(store.load_model(), WorkloadRecommender)
    assert not list((tmp_path / "versions").glob(".incoming-*"))


def test_recommendations_are_written_byte_for_byte_as_one_dump_without_holding_it(
    tmp_path: Path, fitted: WorkloadRecommender
) -> None:
    store = ModelStore(tmp_path)
    usage = make_usage(workloads=2, pods=1, days=1).assign(node="n1")
    with_nodes = fitted.predict().model_copy(update={"nodes": NodeForecaster().fit(usage).predict()})
    assert with_nodes.nodes
    name = store.publish(
        with_nodes,
        fitted,
        source="test",
        parameters={},
        row_counts={"usage_rows": 1},
        fit_metrics={},
        data_window=DataWindow(first_sample=0, last_sample=1, as_of=2),
    ).version
    written = (tmp_path / "versions" / name / "recommendations.json").read_bytes()
    assert written == with_nodes.model_dump_json().encode()


def test_retention_keeps_the_newest(tmp_path: Path, fitted: WorkloadRecommender) -> None:
    store = ModelStore(tmp_path, retention_versions=2)
    names = [publish(store, fitted) for _ in range(4)]
    assert store.versions() == names[-2:]
    assert store.latest_name() == names[-1]


def test_corrupt_file_is_refused_and_older_version_served(tmp_path: Path, fitted: WorkloadRecommender) -> None:
    store = ModelStore(tmp_path)
    good = publish(store, fitted)
    bad = publish(store, fitted)
    target = tmp_path / "versions" / bad / "recommendations.json"
    target.write_bytes(target.read_bytes().replace(b"ns", b"xx", 1))
    with pytest.raises(ModelStoreError, match="checksum does not match"):
        store.load()
    loaded, problems = store.load_latest_valid()
    assert loaded.manifest.version == good
    assert len(problems) == 1 and bad in problems[0]


def test_partial_version_is_refused(tmp_path: Path, fitted: WorkloadRecommender) -> None:
    store = ModelStore(tmp_path)
    name = publish(store, fitted)
    (tmp_path / "versions" / name / "model.joblib").unlink()
    with pytest.raises(ModelStoreError, match="missing; the version is partial"):
        store.load_model()
    (tmp_path / "versions" / name / "manifest.json").write_text("{not json")
    with pytest.raises(ModelStoreError, match="not a valid manifest"):
        store.load()


def test_failed_publish_leaves_the_last_good_version(tmp_path: Path, fitted: WorkloadRecommender) -> None:
    store = ModelStore(tmp_path)
    good = publish(store, fitted)
    before = sorted(p.name for p in (tmp_path / "versions").iterdir())

    class Unpicklable(WorkloadRecommender):
        def __reduce__(self) -> str:  # type: ignore[override]
            raise RuntimeError("disk full")

    broken = Unpicklable().fit(make_usage(workloads=1, pods=1, days=1))
    with pytest.raises(RuntimeError, match="disk full"):
        publish(store, broken)
    assert store.latest_name() == good
    assert sorted(p.name for p in (tmp_path / "versions").iterdir()) == before
    assert store.load().manifest.version == good


def test_empty_store_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelStoreError, match="run `recommender train`"):
        ModelStore(tmp_path).load()
    with pytest.raises(ModelStoreError, match="not a version name"):
        ModelStore(tmp_path).load("../etc")


def test_an_fsspec_store_publishes_loads_and_prunes(fitted: WorkloadRecommender) -> None:
    """An object store stands in for shared storage: memory:// (process-local) through the same code path as s3://."""
    import fsspec

    url = "memory://store-test-" + __import__("secrets").token_hex(4)
    store = ModelStore(url, retention_versions=2)
    try:
        assert store.latest_name() is None and store.versions() == []
        names = [publish(store, fitted) for _ in range(3)]
        assert store.latest_name() == names[-1]
        assert store.versions() == names[1:]
        assert len(store.load().recommendations.recommendations) == 2
        assert isinstance(store.load_model(), WorkloadRecommender)
        assert str(store).startswith("memory://") and store.load().path.startswith("memory://")
        # A corrupt newest version is skipped for the one before it, and the problem is named.
        fsspec.filesystem("memory").pipe_file(f"{store.root}/versions/{names[-1]}/recommendations.json", b"{}")
        loaded, problems = store.load_latest_valid()
        assert loaded.manifest.version == names[1] and "checksum" in problems[0]
    finally:
        fsspec.filesystem("memory").rm(store.root, recursive=True)


def test_an_aborted_version_leaves_latest_and_no_leftovers(tmp_path: Path, fitted: WorkloadRecommender) -> None:
    store = ModelStore(tmp_path)
    first = publish(store, fitted)
    with pytest.raises(RuntimeError), store.writer() as writer:
        writer.write_recommendations(EMPTY)
        writer.write_model(fitted)
        raise RuntimeError("the run fails before its commit")
    assert store.latest_name() == first and store.versions() == [first]
    assert not list((tmp_path / "versions").glob(".incoming-*"))
    with pytest.raises(ModelStoreError, match="nothing more can be written"):
        writer.write_recommendations(EMPTY)
    with store.writer() as left:  # left without a commit: removed as well
        left.write_recommendations(EMPTY)
    assert store.versions() == [first] and not list((tmp_path / "versions").glob(".incoming-*"))


EMPTY = RecommendationSet(as_of=0, horizon_seconds=86400, step_seconds=300, recommendations=[])


def test_a_partition_file_changed_after_its_task_wrote_it_fails_the_commit(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    with (
        pytest.raises(ModelStoreError, match=r"part-00001\.json: changed after its task wrote it"),
        store.writer() as w,
    ):
        written = {i: w.partition(i).write_results(b'{"i": %d}' % i, {"model": i}) for i in (0, 1)}
        Path(w.partition(1).recommendations.removeprefix("file://")).write_bytes(b'{"i": 9}')
        w.collect_partitions(EMPTY, written)
    assert store.versions() == [] and not list((tmp_path / "versions").glob(".incoming-*"))


def test_partitions_collect_into_one_version_without_scratch_files(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    with store.writer() as w:
        written = {i: w.partition(i).write_results(b'{"i": %d}' % i, {"model": i}) for i in (1, 0)}
        assert isinstance(written[0][0], FileEntry)
        w.collect_partitions(EMPTY, written)
        name = w.commit(
            source="test",
            parameters={},
            row_counts={},
            fit_metrics={},
            data_window=DataWindow(first_sample=0, last_sample=1, as_of=2),
        ).version
    version = tmp_path / "versions" / name
    assert sorted(p.name for p in (version / "models").iterdir()) == ["part-00000.joblib", "part-00001.joblib"]
    assert all(p.read_bytes()[:4] == LZ4_MAGIC for p in (version / "models").iterdir())
    assert not (version / "work").exists()
    assert (version / "recommendations.json").read_bytes().count(b'"i"') == 2


def test_a_model_file_is_lz4_and_loads_back_the_same(tmp_path: Path, fitted: WorkloadRecommender) -> None:
    store = ModelStore(tmp_path)
    name = publish(store, fitted)
    assert (tmp_path / "versions" / name / "model.joblib").read_bytes()[:4] == LZ4_MAGIC
    assert store.load_model().predict() == fitted.predict()


def test_a_version_written_with_zlib_models_still_loads(
    tmp_path: Path, fitted: WorkloadRecommender, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions published before the models were LZ4 (joblib's zlib at level 3) load as they did."""
    original = StoreFiles.put_model
    monkeypatch.setattr(StoreFiles, "put_model", lambda self, path, model, **_: original(self, path, model, compress=3))
    store = ModelStore(tmp_path)
    name = publish(store, fitted)
    assert (tmp_path / "versions" / name / "model.joblib").read_bytes()[:1] == b"\x78"  # zlib
    monkeypatch.undo()
    assert store.load_model(name).predict() == fitted.predict()


# -- leftovers of stopped runs (issue 13) ----------------------------------------------------------------------------

WRITER = """
import os, signal, sys, time
from models.store import DataWindow, ModelStore
import recommender.atomic

from recommender.resources import RecommendationSet

store = ModelStore(sys.argv[1])
context = store.writer()  # kept: a collected context would remove the version
writer = context.__enter__()
writer.write_recommendations(RecommendationSet(as_of=0, horizon_seconds=86400, step_seconds=300, recommendations=[]))
if sys.argv[2] == "hold":
    print("ready", flush=True)
    time.sleep(120)
replace = recommender.atomic.os.replace

def die_at_latest(source, destination):
    if str(destination).endswith("latest"):
        os.kill(os.getpid(), signal.SIGKILL)
    replace(source, destination)

recommender.atomic.os.replace = die_at_latest
window = DataWindow(first_sample=0, last_sample=1, as_of=2)
writer.commit(source="killed", parameters={}, row_counts={}, fit_metrics={}, data_window=window)
"""


def killed_writer(root: Path, mode: str) -> subprocess.Popen[str]:
    """A writer process (`hold`: inside a begun version; `latest`: dies as it moves latest), killed with -9."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), mode], stdout=subprocess.PIPE, text=True)
    if mode == "hold":
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        writer.send_signal(signal.SIGKILL)
    assert writer.wait(timeout=60) == -signal.SIGKILL
    return writer


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in [*root.glob(".*.tmp"), *root.glob(".publishing"), *(root / "versions").glob(".*")])


def test_a_killed_writers_incoming_version_goes_at_the_next_run(
    tmp_path: Path, fitted: WorkloadRecommender, caplog: pytest.LogCaptureFixture
) -> None:
    first = publish(ModelStore(tmp_path), fitted)
    killed_writer(tmp_path, "hold")
    assert [p.name.startswith(".incoming-") for p in (tmp_path / "versions").glob(".*")] == [
        True,
        True,
    ]  # its directory and lock
    with caplog.at_level(logging.WARNING, logger="models.store"):
        second = publish(ModelStore(tmp_path), fitted)
    assert leftovers(tmp_path) == [] and ModelStore(tmp_path).versions() == [first, second]
    assert "left by a run that stopped before publishing it" in caplog.text


def test_a_writer_killed_while_moving_latest_leaves_nothing_published_or_temporary(
    tmp_path: Path, fitted: WorkloadRecommender, caplog: pytest.LogCaptureFixture
) -> None:
    first = publish(ModelStore(tmp_path), fitted)
    killed_writer(tmp_path, "latest")
    orphan = (tmp_path / PUBLISHING).read_text()
    assert ModelStore(tmp_path).versions() == [first, orphan] and ModelStore(tmp_path).latest_name() == first
    assert [p.name.startswith(".latest.") for p in tmp_path.glob(".*.tmp")] == [True]
    with caplog.at_level(logging.WARNING, logger="models.store"):
        second = publish(ModelStore(tmp_path), fitted)
    assert leftovers(tmp_path) == [] and ModelStore(tmp_path).versions() == [first, second]
    assert f"removing version {orphan}: complete but never published" in caplog.text
    assert "a temporary file of a run that stopped while publishing" in caplog.text


def test_a_running_writers_version_is_left_alone(tmp_path: Path, fitted: WorkloadRecommender) -> None:
    with ModelStore(tmp_path).writer() as running:
        running.write_recommendations(EMPTY)
        publish(ModelStore(tmp_path), fitted)
        assert (tmp_path / "versions" / f".incoming-{running.name}" / "recommendations.json").is_file()
    assert leftovers(tmp_path) == []


def test_an_unlocked_incoming_version_goes_at_once_not_after_an_hour(
    tmp_path: Path, fitted: WorkloadRecommender
) -> None:
    (tmp_path / "versions" / ".incoming-20260101T000000000000Z-abcdef" / "work").mkdir(parents=True)
    (tmp_path / "versions" / ".incoming-20260101T000000000000Z-abcdef" / "work" / "part-00000.parquet").write_bytes(
        b"x" * 1000
    )
    publish(ModelStore(tmp_path), fitted)
    assert leftovers(tmp_path) == []
