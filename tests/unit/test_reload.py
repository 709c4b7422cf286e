"""What the service reloads from disk: the model version, the TLS pair, the bearer token."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import trustme

from models.store import ModelStore
from serving.routes.auth import TokenFile, Verdict
from serving.state import ServiceState
from serving.tls import CertificateReloader


def test_a_mismatched_pair_is_refused_and_the_serving_pair_kept(tmp_path: Path) -> None:
    ca = trustme.CA()
    first, second = ca.issue_cert("127.0.0.1"), ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    first.cert_chain_pems[0].write_to_path(str(cert))
    first.private_key_pem.write_to_path(str(key))
    reloader = CertificateReloader(cert, key)
    assert reloader.check() is False  # no context yet: uvicorn has not asked for one
    reloader.context_factory(None, lambda: ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    assert reloader.context is not None
    reloader.context.load_cert_chain(cert, key)
    second.cert_chain_pems[0].write_to_path(str(cert))  # the new certificate, the old key: a half-done rotation
    assert reloader.check() is False
    second.private_key_pem.write_to_path(str(key))
    assert reloader.check() is True
    assert reloader.check() is False  # nothing changed since


def test_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    tokens = TokenFile(path)

    def accepts(token: str) -> bool:
        return asyncio.run(tokens.judge(token, "127.0.0.1")) is Verdict.ACCEPTED

    assert accepts("one") and not accepts("two")
    path.write_text("two-longer\n")
    assert accepts("two-longer") and not accepts("one")
    path.unlink()
    assert not accepts("two-longer")


def test_a_broken_latest_keeps_the_loaded_version_and_is_not_retried(tmp_path: Path, usage_csv: Path) -> None:
    from cli.settings import Settings
    from models.settings import StoreSettings
    from pipelines.train import train_from_file

    settings = Settings(store=StoreSettings(path=tmp_path / "store"))
    first = train_from_file(usage_csv, settings)
    state = ServiceState(ModelStore(settings.store.path))
    assert state.refresh_if_published() is True and state.snapshot is not None
    assert state.refresh_if_published() is False
    second = train_from_file(usage_csv, settings)
    (Path(settings.store.path) / "versions" / second.version / "recommendations.json").write_text("{}")
    assert state.refresh_if_published() is False
    assert state.snapshot.version == first.version and "checksum" in (state.last_error or "")
    assert state.refresh_if_published() is False


def test_cluster_view_rebuilds_when_its_files_change_and_survives_bad_ones(tmp_path: Path) -> None:
    import json

    from serving.cluster import ClusterView
    from serving.settings import ExtenderSettings
    from tests import k8s

    nodes = tmp_path / "nodes.json"
    nodes.write_text("{not json")
    view = ClusterView(ExtenderSettings(nodes_file=nodes, pods_file=tmp_path / "missing.json"))
    view.refresh(None)
    assert view.loads.index == {} and view.generation == 1
    view.refresh(None)
    assert view.generation == 1  # nothing changed: nothing rebuilt
    nodes.write_text(json.dumps(k8s.listing("NodeList", [k8s.node("a"), k8s.node("b")])))
    view.refresh(None)
    assert list(view.loads.index) == ["a", "b"] and view.generation == 2


def test_a_replica_on_an_fsspec_store_picks_up_new_versions(usage_csv: Path) -> None:
    """Serving replicas poll the shared store's `latest` and load a version the training job published."""
    import secrets

    import fsspec

    from cli.settings import Settings
    from pipelines.train import train_from_file

    settings = Settings(store={"path": "memory://replica-" + secrets.token_hex(4)})
    try:
        first = train_from_file(usage_csv, settings)
        replica = ServiceState(ModelStore(settings.store.path))
        assert replica.refresh_if_published() is True and replica.require().version == first.version
        assert replica.refresh_if_published() is False
        second = train_from_file(usage_csv, settings)
        assert replica.refresh_if_published() is True and replica.require().version == second.version
    finally:
        fsspec.filesystem("memory").rm(ModelStore(settings.store.path).root, recursive=True)
