"""The model store: atomic publish, latest pointer, retention, and refusal of corrupt or partial versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.store import DataWindow, ModelStore
from models.workload import WorkloadRecommender
from recommender.errors import ModelStoreError
from tests.conftest import make_usage


@pytest.fixture(scope="module")
def fitted() -> WorkloadRecommender:
    return WorkloadRecommender().fit(make_usage(workloads=2, pods=1, days=1))


def publish(store: ModelStore, model: WorkloadRecommender) -> str:
    return store.publish(
        model.predict(),
        model,
        source="test",
        parameters={},
        row_counts={"usage_rows": 1},
        fit_metrics={},
        data_window=DataWindow(first_sample=0, last_sample=1, as_of=2),
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
    incoming = store.begin()
    incoming.put("recommendations.json", b"[]")
    store.abort(incoming)
    assert store.latest_name() == first and store.versions() == [first]
    assert not list((tmp_path / "versions").glob(".incoming-*"))
    with pytest.raises(FileNotFoundError):
        incoming.files.put(incoming.path_of("late.json"), b"{}", create_parents=False)
